//! The twins of `lua/lib/*.lua`: the same steps, on the in-process keyspace.

use redis::Value;

use crate::transport::in_process::{Keyspace, WrongType};

pub(super) type Out = Result<Value, WrongType>;

pub(super) fn int(n: i64) -> Value {
    Value::Int(n)
}

pub(super) fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

pub(super) fn array(items: Vec<Value>) -> Value {
    Value::Array(items)
}

/// `v[i]` of a script's `KEYS` or `ARGV` (0-based here), empty when absent.
pub(super) fn at(v: &[String], i: usize) -> &str {
    v.get(i).map_or("", String::as_str)
}

/// Lua's `tonumber` of a decimal text.
pub(super) fn number(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|n| n.is_finite())
}

/// The largest fence, 2^53 - 1 (see `lua/lib/counter.lua`).
const LARGEST: f64 = 9_007_199_254_740_991.0;

// counter.lua

/// Why the counter's `GET` cannot give the next fence; `None` when it can.
pub(super) fn unusable(last: &Result<Option<String>, WrongType>) -> Option<String> {
    let last = match last {
        Err(WrongType) => {
            return Some("holds a value of another type, not an integer counter".to_owned());
        }
        Ok(None) => return None,
        Ok(Some(last)) => last,
    };
    match number(last) {
        Some(n) if n >= 0.0 && n == n.floor() && n >= LARGEST => Some(format!(
            "is at {last}, at or above the largest fence (2^53 - 1): fences cannot go higher"
        )),
        Some(n) if n >= 0.0 && n == n.floor() => None,
        _ => Some(format!("holds {last}, not an integer counter")),
    }
}

pub(super) fn write_counter(keys: &mut Keyspace, counter: &str, fence: &str, retention_ms: &str) {
    let px = match retention_ms {
        "0" => None,
        ms => ms.parse().ok(),
    };
    keys.set(counter, fence, px);
}

/// Raises `counter` to `record` for a release, only on a counter.
pub(super) fn raise_counter(keys: &mut Keyspace, counter: &str, record: &str, retention_ms: &str) {
    let Ok(last) = keys.get(counter) else { return };
    let last = last.as_deref().map_or(Some(0.0), number);
    if let Some(last) = last
        && last >= 0.0
        && last == last.floor()
        && last < number(record).unwrap_or(0.0)
    {
        write_counter(keys, counter, record, retention_ms);
    }
}

/// The next fence, `max(last + 1, clock in µs rounded down to quantum)`, written to `counter`;
/// with the server's time `(s, µs)`.
pub(super) fn next_fence(
    keys: &mut Keyspace,
    counter: &str,
    last: &Result<Option<String>, WrongType>,
    quantum: &str,
    retention_ms: &str,
) -> (u64, (u64, u64)) {
    let last = match last {
        Ok(Some(last)) => number(last).unwrap_or(0.0) as u64,
        _ => 0,
    };
    let (s, us) = keys.time();
    let mut now = s * 1_000_000 + us;
    let quantum = quantum.parse::<u64>().unwrap_or(1);
    if quantum > 1 {
        now -= now % quantum;
    }
    let fence = (last + 1).max(now);
    write_counter(keys, counter, &fence.to_string(), retention_ms);
    (fence, (s, us))
}

// marks.lua

pub(super) fn starts_with(value: Option<&str>, prefix: &str) -> bool {
    value.is_some_and(|v| v.starts_with(prefix))
}

/// `value` with the waiters' mark set; `None` for a value without that field.
pub(super) fn with_mark(value: &str, unmarked: &str, marked: &str) -> Option<String> {
    value
        .strip_suffix(unmarked)
        .map(|stem| format!("{stem}{marked}"))
}

/// Whether `value` is `token`, as written or with the waiters' mark set.
pub(super) fn is_ours(value: Option<&str>, token: &str, unmarked: &str, marked: &str) -> bool {
    value.is_some_and(|v| v == token || with_mark(token, unmarked, marked).as_deref() == Some(v))
}

/// Sets the waiters' mark of `cur`, the value of `key`, in place (its expiry kept).
pub(super) fn mark_in_place(
    keys: &mut Keyspace,
    key: &str,
    cur: Option<&str>,
    unmarked: &str,
    marked: &str,
) {
    if let Some(value) = cur.and_then(|cur| with_mark(cur, unmarked, marked)) {
        keys.replace_keep_ttl(key, value);
    }
}

// permits.lua

/// Whether `mark_key` holds the mark of these N `permits` (`mark` and N).
pub(super) fn holds_mark(
    keys: &mut Keyspace,
    mark_key: &str,
    permits: &[String],
    mark: &str,
) -> bool {
    let ours = format!("{mark}{}", permits.len());
    keys.get(mark_key).ok().flatten().as_deref() == Some(ours.as_str())
}

/// Frees `mark_key` of the mark of these N `permits` once none of them exists.
pub(super) fn free_mark(keys: &mut Keyspace, mark_key: &str, permits: &[String], mark: &str) {
    if permits.iter().any(|p| keys.exists(p)) {
        return;
    }
    if holds_mark(keys, mark_key, permits, mark) {
        keys.del(mark_key);
    }
}

// queue.lua

/// `{-1, type, key}` when `key` holds a type other than `kind`.
pub(super) fn foreign(keys: &mut Keyspace, key: &str, kind: &str) -> Option<Value> {
    let found = keys.type_of(key);
    (found != "none" && found != kind).then(|| array(vec![int(-1), bulk(found), bulk(key)]))
}

/// `out`, the reply of an attempt on the queue `q`; when one of its commands met a key of
/// another type, `foreign`'s reply for the queue or its states instead (`unless_foreign`).
pub(super) fn unless_foreign(keys: &mut Keyspace, q: &Queue<'_>, out: Out) -> Out {
    match out {
        Err(WrongType) => foreign(keys, q.queue, "zset")
            .or_else(|| foreign(keys, q.states, "hash"))
            .ok_or(WrongType),
        out => out,
    }
}

/// Evicts the queue head `evict` if its state is still `seen`, with any of `locks` handed to it.
pub(super) fn evict_stale_head(
    keys: &mut Keyspace,
    q: &Queue<'_>,
    evict: &str,
    seen: &str,
    locks: &[String],
    handed: &str,
) -> Result<(), WrongType> {
    if evict.is_empty() || keys.hget(q.states, evict)?.as_deref() != Some(seen) {
        return Ok(());
    }
    q.remove(keys, evict)?;
    let mine = format!("{handed}{evict}");
    for key in locks {
        if keys.get(key).ok().flatten().as_deref() == Some(mine.as_str()) {
            keys.del(key);
        }
    }
    Ok(())
}

/// A lock's waiter queue and the states of its waiters.
pub(super) struct Queue<'a> {
    pub queue: &'a str,
    pub states: &'a str,
}

impl Queue<'_> {
    /// Puts `waiter` last unless it is in the queue, with its `state`; keeps both for 4 graces.
    pub(super) fn join(
        &self,
        keys: &mut Keyspace,
        waiter: &str,
        state: &str,
        grace_ms: &str,
    ) -> Result<(), WrongType> {
        self.enter(keys, waiter, state, true)?;
        self.keep(keys, grace_ms, false);
        Ok(())
    }

    /// Puts `waiter` last unless it is in the queue (looked up only when `maybe_queued`), with
    /// its `state`: the queue read, then the state written, then the queue (see `queue.lua`).
    /// True when the queue was new.
    pub(super) fn enter(
        &self,
        keys: &mut Keyspace,
        waiter: &str,
        state: &str,
        maybe_queued: bool,
    ) -> Result<bool, WrongType> {
        let queued = maybe_queued && keys.zscore(self.queue, waiter)?.is_some();
        let last = if queued {
            None
        } else {
            Some(keys.zrange(self.queue, -1, -1)?.first().map(|(_, s)| *s))
        };
        keys.hset(self.states, waiter, state)?;
        let Some(last) = last else {
            return Ok(false);
        };
        keys.zadd(self.queue, last.unwrap_or(0.0) + 1.0, waiter, true, false)?;
        Ok(last.is_none())
    }

    /// Extends both keys to 4 graces once less than half of that is left (or `created`).
    pub(super) fn keep(&self, keys: &mut Keyspace, grace_ms: &str, created: bool) {
        let keep = 4 * grace_ms.parse::<i64>().unwrap_or(0);
        if created || keys.pttl(self.states) < keep / 2 {
            keys.pexpire(self.queue, keep);
            keys.pexpire(self.states, keep);
        }
    }

    /// Takes `waiter` out.
    pub(super) fn remove(&self, keys: &mut Keyspace, waiter: &str) -> Result<(), WrongType> {
        keys.zrem(self.queue, waiter)?;
        keys.hdel(self.states, waiter)
    }
}

/// Whether `text` is one or more decimal digits.
fn digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// An exclusive waiter's state `<nonce> <ttl> <grace>`: its nonce and grace.
pub(super) fn exclusive_state(state: &str) -> Option<(&str, &str)> {
    let mut parts = state.split(' ');
    let (nonce, ttl, grace) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none() && !nonce.is_empty() && digits(ttl) && digits(grace))
        .then_some((nonce, grace))
}

/// A shared (or by-id) waiter's state `<nonce> <grace>`: its grace.
pub(super) fn short_state(state: &str) -> Option<&str> {
    let (nonce, grace) = state.split_once(' ')?;
    (!nonce.is_empty() && !nonce.contains(' ') && digits(grace)).then_some(grace)
}

/// `{2, that waiter, its state}` when `cur` hands the lock to a waiter by id.
pub(super) fn handed_to_another(
    keys: &mut Keyspace,
    cur: Option<&str>,
    states: &str,
    handed: &str,
) -> Result<Option<Value>, WrongType> {
    let Some(head) = cur.and_then(|c| c.strip_prefix(handed)) else {
        return Ok(None);
    };
    let state = keys.hget(states, head)?;
    Ok(Some(array(vec![int(2), bulk(head), opt(state)])))
}

/// A text or nil.
pub(super) fn opt(text: Option<String>) -> Value {
    text.map_or(Value::Nil, |t| bulk(&t))
}
