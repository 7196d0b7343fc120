//! The twins of the renewal scripts: `renew.lua` and `renew_any_slot.lua` (with
//! `lua/lib/renew_one.lua`).

use redis::Value;

use super::lib::{Out, at, int, is_ours, starts_with};
use crate::transport::in_process::Keyspace;

/// `RENEW`.
pub(super) fn renew(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let marks = Marks::of(a);
    let out = k
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let (token, ttl) = (at(a, 4 + 2 * i), at(a, 5 + 2 * i));
            int(renew_one(keys, key, token, ttl, &marks).unwrap_or(0))
        })
        .collect();
    Ok(Value::Array(out))
}

/// `RENEW_ANY_SLOT`: keys among the arguments (one in-process server holds every slot).
pub(super) fn renew_any_slot(keys: &mut Keyspace, _: &[String], a: &[String]) -> Out {
    let marks = Marks::of(a);
    let out = a
        .get(4..)
        .unwrap_or_default()
        .chunks_exact(3)
        .map(|l| int(renew_one(keys, &l[0], &l[1], &l[2], &marks).unwrap_or(2)))
        .collect();
    Ok(Value::Array(out))
}

/// The marks a renewal knows (see `lua/lib/renew_one.lua`).
struct Marks<'a> {
    unmarked: &'a str,
    marked: &'a str,
    shared: &'a str,
    permits: &'a str,
}

impl<'a> Marks<'a> {
    /// The marks, the first four arguments of both renewal scripts.
    fn of(a: &'a [String]) -> Self {
        Self {
            unmarked: at(a, 0),
            marked: at(a, 1),
            shared: at(a, 2),
            permits: at(a, 3),
        }
    }
}

/// The renewal of one lease: 1 renewed, 0 not ours.
fn renew_one(
    keys: &mut Keyspace,
    key: &str,
    token: &str,
    ttl_ms: &str,
    m: &Marks<'_>,
) -> Option<i64> {
    let ttl = ttl_ms.parse::<i64>().unwrap_or(0);
    let Ok(value) = keys.get(key) else {
        // A set of shared holders: this holder's place moves, unless it has passed.
        let Ok(Some(until)) = keys.zscore(key, token) else {
            return Some(0);
        };
        let now = keys.now_ms() as f64;
        if until <= now {
            return Some(0);
        }
        keys.zadd(key, now + ttl as f64, token, false, true).ok()?;
        if keys.pttl(key) < ttl {
            keys.pexpire(key, ttl);
        }
        return Some(1);
    };
    if !is_ours(value.as_deref(), token, m.unmarked, m.marked) {
        return Some(0);
    }
    let many = starts_with(value.as_deref(), m.shared) || starts_with(value.as_deref(), m.permits);
    if !many || keys.pttl(key) < ttl {
        keys.pexpire(key, ttl);
    }
    Some(1)
}
