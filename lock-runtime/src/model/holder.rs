//! Who holds a lock: the value a lease stores in its key is a fresh token followed by who took
//! it, so that an operator can tell (`Locker::inspect`, `lockctl`). The scripts compare the
//! whole value as one opaque string (as written, or with the waiters' mark set); only
//! inspection reads it apart.
//!
//! Format: `<token>;h=<host>;p=<pid>[;l=<label>];w=0`. The token is 22 characters of the
//! URL-safe base64 alphabet: the time the attempt began (8) and 84 random bits (14); short
//! field names keep a value within the 44 bytes that Redis stores in one allocation, for a short
//! host name. Host and label keep ASCII letters, digits and `.`, `_`, `-`, `/`; every other
//! character becomes `_` (the value then has no space, which the waiter queue's state string
//! relies on, and no `;` or `=` inside a field). The last field is the waiters' mark: a waiter
//! that queues behind the holder turns it into `;w=1` in place (see `scripts::ACQUIRE`), so
//! that the holder's release knows, without looking at the queue, that it has a lock to hand
//! over. A value without it (another client's) is never changed.
//! Waiters queue under an id of the same form that ends with `;grants=<16 hex digits>`: their
//! locker's grant channel, on which a release that grants one of them the lock says so.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who took a lock, as its key's value says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The token of this acquisition (22 URL-safe base64 characters).
    pub token: String,
    /// When the acquisition that wrote the value began, by the holder's clock: the holder has
    /// held the lock since about then (a waiter since its last attempt before the lock was
    /// handed to it).
    pub since: SystemTime,
    /// The host name of the holder's machine.
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// The label given to the holder's `LockerBuilder::label`, if any.
    pub label: Option<String>,
}

impl Holder {
    /// Reads a key's value; `None` when it is not in this format (another client's value).
    pub fn parse(value: &str) -> Option<Holder> {
        let mut fields = value.split(';');
        let token = fields.next()?;
        let ours = token.len() == crate::model::random::TOKEN_LEN
            && token
                .bytes()
                .all(|b| crate::model::random::TOKEN_ALPHABET.contains(&b));
        if !ours {
            return None;
        }
        let since = UNIX_EPOCH + Duration::from_millis(crate::model::random::stamp_of(token)?);
        let (mut host, mut pid, mut label) = (None, None, None);
        for field in fields {
            match field.split_once('=')? {
                ("h", h) => host = Some(h.to_owned()),
                ("p", p) => pid = Some(p.parse().ok()?),
                ("l", l) => label = Some(l.to_owned()),
                // Fields a later version may add.
                _ => {}
            }
        }
        Some(Holder {
            token: token.to_owned(),
            since,
            host: host?,
            pid: pid?,
            label,
        })
    }
}

/// What every value this process writes ends with: `;h=..;p=..[;l=..];w=0`, made once per
/// locker.
pub(crate) fn suffix(label: Option<&str>) -> String {
    let mut out = format!(";h={};p={}", clean(&host_name()), std::process::id());
    if let Some(label) = label {
        out.push_str(";l=");
        out.push_str(&clean(label));
    }
    out.push_str(UNMARKED);
    out
}

/// The last field of every value this version writes; a queued waiter turns its `0` into `1`.
pub(crate) const UNMARKED: &str = ";w=0";

/// A fresh token followed by `suffix`, in one allocation.
pub(crate) fn value(suffix: &str) -> String {
    let mut value = String::with_capacity(crate::model::random::TOKEN_LEN + suffix.len());
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    crate::model::random::push_token(&mut value, now_ms);
    value.push_str(suffix);
    value
}

/// This machine's host name: the kernel's, else `HOSTNAME`, else `unknown`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn clean(s: &str) -> String {
    let kept: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if kept.is_empty() {
        "_".to_owned()
    } else {
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_into_their_holder() {
        let suffix = suffix(Some("billing worker;#2"));
        let value = value(&suffix);
        assert!(!value.contains(' '), "{value}");
        let holder = Holder::parse(&value).unwrap();
        assert_eq!(holder.pid, std::process::id());
        assert_eq!(holder.label.as_deref(), Some("billing_worker__2"));
        assert_eq!(holder.token.len(), crate::model::random::TOKEN_LEN);
        assert!(value.starts_with(&holder.token));
        assert!(!holder.host.is_empty());
        // The waiters' mark is the last field, and a marked value still reads back.
        assert!(value.ends_with(UNMARKED), "{value}");
        let marked = format!("{}1", &value[..value.len() - 1]);
        assert_eq!(Holder::parse(&marked).as_ref(), Some(&holder));
        let no_label = Holder::parse(&self::value(&self::suffix(None))).unwrap();
        assert_eq!(no_label.label, None);
        // Other clients' values are not ours to read.
        for foreign in [
            "",
            "x",
            "8f3c0d5e-4b1a-4c2e-9f6d-2a7b8c9d0e1f",
            "0123456789abcdef0123456789abcdef;host=h;pid=7;label=x;w=1",
            "0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(Holder::parse(foreign), None, "{foreign}");
        }
        // A field a later version adds is skipped.
        let later = "AAAAAAAAAAAAAAAAAAAA-_;h=h;p=7;zone=eu";
        assert_eq!(Holder::parse(later).unwrap().pid, 7);
        // The holder's time stamp reads back, to the ms.
        let since = holder.since.duration_since(UNIX_EPOCH).unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert!(
            now >= since && now - since < Duration::from_secs(60),
            "{since:?}"
        );
        // With a short host name, a value fits the 44 bytes Redis keeps in one allocation.
        let short = self::value(&format!(";h=vm;p={}{UNMARKED}", u32::MAX));
        assert!(short.len() <= 44, "{short}");
    }
}
