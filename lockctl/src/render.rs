//! How `lockctl` shows locks: lines that fit a terminal, or JSON (`--json`, one object per line
//! for `watch`).

use std::fmt::Write;
use std::time::Duration;

use lock_runtime::{Holder, LockInfo, LockState};

/// `web-1 pid 1234 (billing)`, or what the value is when it is not a holder's.
pub(crate) fn holder_text(info: &LockInfo) -> String {
    let who = |h: &Holder| match &h.label {
        Some(label) => format!("{} pid {} ({label})", h.host, h.pid),
        None => format!("{} pid {}", h.host, h.pid),
    };
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
        let _ = writeln!(
            out,
            "{:width$}  {}  ttl {}  {} waiting",
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
        let who = w.holder.as_ref().map_or_else(
            || w.id.clone(),
            |h| match &h.label {
                Some(label) => format!("{} pid {} ({label})", h.host, h.pid),
                None => format!("{} pid {}", h.host, h.pid),
            },
        );
        let _ = write!(out, "\n  {}. {who}", i + 1);
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
            let waiters: Vec<String> = i
                .waiters
                .iter()
                .map(|w| {
                    w.holder
                        .as_ref()
                        .map_or_else(|| w.id.clone(), |h| format!("{} pid {}", h.host, h.pid))
                })
                .collect();
            format!(
                "+{secs:.3}s  {name}: {}  waiting: [{}]",
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
    format!(
        "{{\"name\":{},\"key\":{},\"held\":true,\"state\":{},\"holder\":{},\"value\":{},\"fence\":{},\"ttl_left_ms\":{},\"waiters\":[{}]}}",
        quote(&i.name),
        quote(&i.key),
        quote(state_name(&i.state)),
        i.holder.as_ref().map_or_else(|| "null".to_owned(), holder),
        quote(&i.value),
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
    use super::quote;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }
}
