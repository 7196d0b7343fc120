//! How `lockctl` shows locks: lines that fit a terminal, or JSON (`--json`, one object per line
//! for `watch`).

use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{Holder, Holding, LockInfo, LockState, Waiting};

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

/// Whether the lock is held by holders that hold it together: shared holders, or the holders
/// of its permits. Such a lock is shown holder by holder; an exclusive lock as one holder.
pub(crate) fn several(info: &LockInfo) -> bool {
    info.holders.iter().any(|h| h.shared || h.permit.is_some())
}

/// How the lock is held: `exclusive`, `shared` or `permits`.
fn lock_mode(info: &LockInfo) -> &'static str {
    if info.state == LockState::Shared {
        "shared"
    } else if info.holders.iter().any(|h| h.permit.is_some()) {
        "permits"
    } else {
        "exclusive"
    }
}

/// How one holder holds the lock: `permit 1 of 3`, `shared` or `exclusive`.
pub(crate) fn holding_mode(info: &LockInfo, h: &Holding) -> String {
    match (h.permit, info.permits) {
        (Some(i), Some(n)) => format!("permit {i} of {n}"),
        (Some(i), None) => format!("permit {i}"),
        _ if h.shared => "shared".to_owned(),
        _ => "exclusive".to_owned(),
    }
}

/// `web-1 pid 1234 (billing)` for one holder, or what its value is when it is not a holder's.
pub(crate) fn holding_who(h: &Holding) -> String {
    match &h.holder {
        Some(holder) if h.value.ends_with(":released") => {
            format!("{} (released, kept for min_hold)", who(holder))
        }
        Some(holder) => who(holder),
        None => format!("another client (value {:?})", h.value),
    }
}

/// `shared by 2` or `2 of 3 permits held`.
fn holders_summary(info: &LockInfo) -> String {
    let n = info.holders.len();
    match info.permits {
        _ if info.state == LockState::Shared => format!("shared by {n}"),
        Some(of) => format!("{n} of {of} permits held"),
        None => format!("{n} permits held"),
    }
}

/// One of several holders: `permit 1 of 3  web-1 pid 1234 (billing)  fence 17  held 12s (since
/// ..)  ttl 4.9s`, with its token when asked.
pub(crate) fn holding_text(info: &LockInfo, h: &Holding, token: bool) -> String {
    let mut out = format!("{}  {}", holding_mode(info, h), holding_who(h));
    if let Some(fence) = h.fence {
        let _ = write!(out, "  fence {fence}");
    }
    if let Some(since) = h.holder.as_ref().map(|h| h.since) {
        let _ = write!(
            out,
            "  held {} (since {})",
            duration_text(held_for(since)),
            utc_text(since)
        );
    }
    let _ = write!(out, "  ttl {}", ttl_text(h.ttl_left));
    if let Some(holder) = h.holder.as_ref().filter(|_| token) {
        let _ = write!(out, "  token {}", holder.token);
    }
    out
}

/// `web-1 pid 1234 (billing)`, or what the value is when it is not a holder's; for a lock held
/// by several, each with how it holds it.
pub(crate) fn holder_text(info: &LockInfo) -> String {
    if several(info) {
        let each: Vec<String> = info
            .holders
            .iter()
            .map(|h| format!("{}: {}", holding_mode(info, h), holding_who(h)))
            .collect();
        return format!("{}: {}", holders_summary(info), each.join(", "));
    }
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
        LockState::Shared => "shared",
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
        if several(l) {
            // A shared hold has one key, and so one time left; permits have one each.
            let ttl = if l.state == LockState::Shared {
                format!("  ttl {}", ttl_text(l.ttl_left))
            } else {
                String::new()
            };
            let summary = holders_summary(l);
            let waiting = l.waiters.len();
            let _ = writeln!(out, "{:width$}  {summary}{ttl}  {waiting} waiting", l.name);
            for h in &l.holders {
                let _ = writeln!(out, "  - {}", holding_text(l, h, false));
            }
            continue;
        }
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
    if several(info) {
        inspect_several(&mut out, info);
    } else {
        inspect_one(&mut out, info);
    }
    let _ = write!(out, "waiters   {}", info.waiters.len());
    for (i, w) in info.waiters.iter().enumerate() {
        let _ = write!(out, "\n  {}. {}", i + 1, waiter_text(w));
    }
    out
}

/// The lines of `inspect` for a lock held by several: each holder, with how it holds the lock.
fn inspect_several(out: &mut String, info: &LockInfo) {
    let _ = writeln!(out, "holders   {}", holders_summary(info));
    for h in &info.holders {
        let _ = writeln!(out, "  - {}", holding_text(info, h, true));
    }
    fence_line(out, info.fence, false);
    if info.state == LockState::Shared {
        let _ = writeln!(out, "ttl left  {}", ttl_text(info.ttl_left));
    }
}

/// The fence counter's line. A lock held by one holder that took it uncontended has a fence the
/// counter does not show yet: its release writes it there.
fn fence_line(out: &mut String, fence: Option<u64>, held_by_one: bool) {
    let _ = match (fence, held_by_one) {
        (Some(f), true) => writeln!(
            out,
            "fence     {f} last recorded; the holder's is {f}, or a higher one its release records"
        ),
        (None, true) => writeln!(
            out,
            "fence     the holder's is recorded at its release; none is recorded before it"
        ),
        (Some(f), false) => writeln!(out, "fence     {f} (last recorded)"),
        (None, false) => writeln!(out, "fence     none recorded"),
    };
}

/// The lines of `inspect` for an exclusive lock: its holder.
fn inspect_one(out: &mut String, info: &LockInfo) {
    let _ = writeln!(out, "holder    {}", holder_text(info));
    if let Some(held) = held_text(info) {
        let _ = writeln!(out, "held      {}", held.trim_start_matches("held "));
    }
    if let Some(h) = &info.holder {
        let _ = writeln!(out, "token     {}", h.token);
    }
    fence_line(out, info.fence, info.state == LockState::Held);
    let _ = writeln!(out, "ttl left  {}", ttl_text(info.ttl_left));
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
            // Several holders were each taken at their own time.
            let held = held_text(i)
                .filter(|_| !several(i))
                .map_or_else(String::new, |h| format!("  {h}"));
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

/// A holder as JSON: `{"host":..,"pid":..,"label":..,"token":..}`.
fn holder_json(h: &Holder) -> String {
    format!(
        "{{\"host\":{},\"pid\":{},\"label\":{},\"token\":{}}}",
        quote(&h.host),
        h.pid,
        h.label.as_deref().map_or_else(|| "null".to_owned(), quote),
        quote(&h.token)
    )
}

/// A number, or `null`.
fn opt(n: Option<u128>) -> String {
    n.map_or_else(|| "null".to_owned(), |n| n.to_string())
}

/// Since when, and for how long, as `"held_since_ms":..,"held_for_ms":..`.
fn held_json(since: Option<SystemTime>) -> String {
    format!(
        "\"held_since_ms\":{},\"held_for_ms\":{}",
        opt(since.map(|s| s.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis())),
        opt(since.map(|s| held_for(s).as_millis()))
    )
}

/// One holder as JSON, with how it holds the lock: `"mode"` is `exclusive`, `shared` or
/// `permit` (then `"permit"` is its number).
fn holding_json(h: &Holding) -> String {
    let mode = match h.permit {
        Some(_) => "permit",
        None if h.shared => "shared",
        None => "exclusive",
    };
    format!(
        "{{\"mode\":{},\"permit\":{},\"holder\":{},\"value\":{},{},\"fence\":{},\"ttl_left_ms\":{}}}",
        quote(mode),
        opt(h.permit.map(u128::from)),
        h.holder
            .as_ref()
            .map_or_else(|| "null".to_owned(), holder_json),
        quote(&h.value),
        held_json(h.holder.as_ref().map(|h| h.since)),
        opt(h.fence.map(u128::from)),
        opt(h.ttl_left.map(|t| t.as_millis())),
    )
}

fn info_json(i: &LockInfo) -> String {
    let waiters: Vec<String> = i
        .waiters
        .iter()
        .map(|w| {
            format!(
                "{{\"id\":{},\"holder\":{}}}",
                quote(&w.id),
                w.holder
                    .as_ref()
                    .map_or_else(|| "null".to_owned(), holder_json)
            )
        })
        .collect();
    let holders: Vec<String> = i.holders.iter().map(holding_json).collect();
    format!(
        "{{\"name\":{},\"key\":{},\"held\":true,\"state\":{},\"holder\":{},\"value\":{},{},\"fence\":{},\"ttl_left_ms\":{},\"waiters\":[{}],\"mode\":{},\"permits\":{},\"holders\":[{}]}}",
        quote(&i.name),
        quote(&i.key),
        quote(state_name(&i.state)),
        i.holder
            .as_ref()
            .map_or_else(|| "null".to_owned(), holder_json),
        quote(&i.value),
        held_json(held_since(i)),
        opt(i.fence.map(u128::from)),
        opt(i.ttl_left.map(|t| t.as_millis())),
        waiters.join(","),
        quote(lock_mode(i)),
        opt(i.permits.map(u128::from)),
        holders.join(",")
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
