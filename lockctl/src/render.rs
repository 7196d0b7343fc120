//! How `lockctl` shows locks: lines that fit a terminal, or JSON (`--json`, one object per line
//! for `watch`).

use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{Holder, LockInfo, LockState, Waiting};

/// `web-1 pid 1234 (billing)`.
fn who(h: &Holder) -> String {
    match &h.label {
        Some(label) => format!("{} pid {} ({label})", h.host, h.pid),
        None => format!("{} pid {}", h.host, h.pid),
    }
}

/// A waiter as [`who`] shows a holder, or its queue id when that is not a holder's.
fn waiter_text(w: &Waiting) -> String {
    w.holder.as_ref().map_or_else(|| w.id.clone(), who)
}

/// `web-1 pid 1234 (billing)`, or what the value is when it is not a holder's.
pub(crate) fn holder_text(info: &LockInfo) -> String {
    match (&info.state, &info.holder) {
        (LockState::Held, Some(h)) => who(h),
        (LockState::MinHold, Some(h)) => format!("{} (released, kept for min_hold)", who(h)),
        (LockState::HandedOver { .. }, Some(h)) => {
            format!("{} (handed over, not taken yet)", who(h))
        }
        (LockState::HandedOver { to }, None) => format!("waiter {to} (handed over, not taken yet)"),
        _ => format!("another client (value {:?})", info.value),
    }
}

/// Since when the lock has been held, when its holder took it (not while it is handed over to a
/// waiter, or written by another client). The time is the holder's clock, the duration is
/// measured against this machine's, so clock skew between the two shows in it.
fn held_since(info: &LockInfo) -> Option<SystemTime> {
    match (&info.state, &info.holder) {
        (LockState::Held | LockState::MinHold, Some(h)) => Some(h.since),
        _ => None,
    }
}

/// How long since `since`; zero when the holder's clock is ahead of ours.
fn held_for(since: SystemTime) -> Duration {
    SystemTime::now().duration_since(since).unwrap_or_default()
}

/// `held 12s (since 2025-01-02 10:11:12 UTC)`.
fn held_text(info: &LockInfo) -> Option<String> {
    let since = held_since(info)?;
    Some(format!(
        "held {} (since {})",
        duration_text(held_for(since)),
        utc_text(since)
    ))
}

/// `450ms`, `12s`, `3m 12s`, `2h 5m`, `1d 3h`.
fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// `2025-01-02 10:11:12 UTC` (UTC: the holder may be in another time zone than the operator).
fn utc_text(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let (days, rest) = (secs / 86400, secs % 86400);
    let (y, m, d) = civil_date(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u64::from(m <= 2), m, d)
}

fn ttl_text(ttl: Option<Duration>) -> String {
    match ttl {
        Some(t) => format!("{:.1}s", t.as_secs_f64()),
        None => "no expiry".to_owned(),
    }
}

fn state_name(state: &LockState) -> &'static str {
    match state {
        LockState::Held => "held",
        LockState::MinHold => "min_hold",
        LockState::HandedOver { .. } => "handed_over",
        _ => "foreign",
    }
}

pub(crate) fn list(locks: &[LockInfo], json: bool) -> String {
    if json {
        let items: Vec<String> = locks.iter().map(info_json).collect();
        return format!("[{}]", items.join(","));
    }
    if locks.is_empty() {
        return "no lock held".to_owned();
    }
    let width = locks
        .iter()
        .map(|l| l.name.len())
        .max()
        .unwrap_or(0)
        .min(40);
    let mut out = String::new();
    for l in locks {
        let held = held_text(l).map_or_else(String::new, |h| format!("  {h}"));
        let _ = writeln!(
            out,
            "{:width$}  {}{held}  ttl {}  {} waiting",
            l.name,
            holder_text(l),
            ttl_text(l.ttl_left),
            l.waiters.len()
        );
    }
    out.pop();
    out
}

pub(crate) fn inspect(name: &str, info: Option<&LockInfo>, json: bool) -> String {
    let Some(info) = info else {
        return if json {
            format!("{{\"name\":{},\"held\":false}}", quote(name))
        } else {
            format!("`{name}` is free")
        };
    };
    if json {
        return info_json(info);
    }
    let mut out = String::new();
    let _ = writeln!(out, "name      {}", info.name);
    let _ = writeln!(out, "key       {}", info.key);
    let _ = writeln!(out, "state     {}", state_name(&info.state));
    let _ = writeln!(out, "holder    {}", holder_text(info));
    if let Some(held) = held_text(info) {
        let _ = writeln!(out, "held      {}", held.trim_start_matches("held "));
    }
    if let Some(h) = &info.holder {
        let _ = writeln!(out, "token     {}", h.token);
    }
    match info.fence {
        Some(f) => {
            let _ = writeln!(out, "fence     {f} (last recorded)");
        }
        None => {
            let _ = writeln!(out, "fence     none recorded yet");
        }
    }
    let _ = writeln!(out, "ttl left  {}", ttl_text(info.ttl_left));
    let _ = write!(out, "waiters   {}", info.waiters.len());
    for (i, w) in info.waiters.iter().enumerate() {
        let _ = write!(out, "\n  {}. {}", i + 1, waiter_text(w));
    }
    out
}

/// One line of `watch`: the time since it started and the new state.
pub(crate) fn change(name: &str, at: Duration, info: Option<&LockInfo>, json: bool) -> String {
    let at_ms = at.as_millis();
    if json {
        let lock = info.map_or_else(|| "null".to_owned(), info_json);
        return format!(
            "{{\"at_ms\":{at_ms},\"name\":{},\"lock\":{lock}}}",
            quote(name)
        );
    }
    let secs = at.as_secs_f64();
    match info {
        None => format!("+{secs:.3}s  {name}: free"),
        Some(i) => {
            let waiters: Vec<String> = i.waiters.iter().map(waiter_text).collect();
            let held = held_text(i).map_or_else(String::new, |h| format!("  {h}"));
            format!(
                "+{secs:.3}s  {name}: {}{held}  waiting: [{}]",
                holder_text(i),
                waiters.join(", ")
            )
        }
    }
}

/// What `release` did.
pub(crate) fn outcome(
    name: &str,
    what: &str,
    message: &str,
    info: Option<&LockInfo>,
    json: bool,
) -> String {
    if json {
        let lock = info.map_or_else(|| "null".to_owned(), info_json);
        return format!(
            "{{\"name\":{},\"outcome\":{},\"message\":{},\"lock\":{lock}}}",
            quote(name),
            quote(what),
            quote(message)
        );
    }
    format!("{what}: `{name}`: {message}")
}

fn info_json(i: &LockInfo) -> String {
    let holder = |h: &Holder| {
        format!(
            "{{\"host\":{},\"pid\":{},\"label\":{},\"token\":{}}}",
            quote(&h.host),
            h.pid,
            h.label.as_deref().map_or_else(|| "null".to_owned(), quote),
            quote(&h.token)
        )
    };
    let waiters: Vec<String> = i
        .waiters
        .iter()
        .map(|w| {
            format!(
                "{{\"id\":{},\"holder\":{}}}",
                quote(&w.id),
                w.holder.as_ref().map_or_else(|| "null".to_owned(), holder)
            )
        })
        .collect();
    let opt = |n: Option<u128>| n.map_or_else(|| "null".to_owned(), |n| n.to_string());
    let since = held_since(i);
    format!(
        "{{\"name\":{},\"key\":{},\"held\":true,\"state\":{},\"holder\":{},\"value\":{},\"held_since_ms\":{},\"held_for_ms\":{},\"fence\":{},\"ttl_left_ms\":{},\"waiters\":[{}]}}",
        quote(&i.name),
        quote(&i.key),
        quote(state_name(&i.state)),
        i.holder.as_ref().map_or_else(|| "null".to_owned(), holder),
        quote(&i.value),
        opt(since.map(|s| s.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis())),
        opt(since.map(|s| held_for(s).as_millis())),
        opt(i.fence.map(u128::from)),
        opt(i.ttl_left.map(|t| t.as_millis())),
        waiters.join(",")
    )
}

/// A JSON string.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    #[test]
    fn hold_times_read_as_a_person_writes_them() {
        let cases = [
            (450, "450ms"),
            (12_300, "12s"),
            (192_000, "3m 12s"),
            (7_500_000, "2h 5m"),
            (97_200_000, "1d 3h"),
        ];
        for (ms, text) in cases {
            assert_eq!(duration_text(Duration::from_millis(ms)), text);
        }
        let at = |secs| utc_text(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(at(951_825_600), "2000-02-29 12:00:00 UTC");
        assert_eq!(at(1_735_689_599), "2024-12-31 23:59:59 UTC");
        assert_eq!(at(4_107_542_400), "2100-03-01 00:00:00 UTC");
    }
}
