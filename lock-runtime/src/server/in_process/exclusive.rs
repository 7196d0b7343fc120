//! The twins of the scripts of an exclusive lock: `acquire.lua`, `acquire_unqueued.lua`,
//! `release.lua`, `release_short.lua`, `fence.lua` and `raise_fence.lua`.

use super::hand_over::{HandOver, hand_over};
use super::lib::{
    Out, Queue, array, at, bulk, evict_stale_head, free_mark, handed_to_another, holds_mark, int,
    is_ours, mark_in_place, next_fence, opt, raise_counter, starts_with, unless_foreign, unusable,
    with_mark,
};
use crate::transport::in_process::{Keyspace, WrongType};

/// `ACQUIRE`: the attempt, or the queue's key of another type that one of its commands met.
pub(super) fn acquire(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let q = Queue {
        queue: at(k, 2),
        states: at(k, 3),
    };
    let out = attempt(keys, k, a, &q);
    unless_foreign(keys, &q, out)
}

/// `ACQUIRE`'s `attempt`.
fn attempt(keys: &mut Keyspace, k: &[String], a: &[String], q: &Queue<'_>) -> Out {
    let (lock, counter) = (at(k, 0), at(k, 1));
    let (token, ttl_ms, quantum, retention_ms) = (at(a, 0), at(a, 1), at(a, 2), at(a, 3));
    let (waiter, grace_ms, evict, seen, previous) =
        (at(a, 4), at(a, 5), at(a, 6), at(a, 7), at(a, 8));
    let (unmarked, marked, handed, permits_mark) = (at(a, 9), at(a, 10), at(a, 11), at(a, 12));

    evict_stale_head(keys, q, evict, seen, &[lock.to_owned()], handed)?;
    // Looked up only where it decides (see `acquire.lua`), once.
    let mut looked: Option<Option<String>> = None;
    let mut first_in_line = |keys: &mut Keyspace| -> Result<Option<String>, WrongType> {
        if let Some(first) = &looked {
            return Ok(first.clone());
        }
        let first = first_live(keys, q)?.filter(|first| first != waiter);
        looked = Some(first.clone());
        Ok(first)
    };
    let Ok(cur) = keys.get(lock) else {
        return Ok(array(vec![int(-1), bulk(keys.type_of(lock))]));
    };
    let cur = cur.as_deref();
    if starts_with(cur, permits_mark) {
        return Ok(array(vec![int(-3), opt(cur.map(str::to_owned))]));
    }
    let ours = cur.is_some_and(|cur| {
        !waiter.is_empty()
            && (cur == format!("{handed}{waiter}")
                || (!previous.is_empty()
                    && (cur == previous
                        || with_mark(previous, unmarked, marked).as_deref() == Some(cur))))
    });
    if ours || (cur.is_none() && first_in_line(keys)?.is_none()) {
        let last = keys.get(counter);
        if let Some(why) = unusable(&last) {
            return Ok(array(vec![int(-2), bulk(&why)]));
        }
        let mut value = token.to_owned();
        if !waiter.is_empty() {
            q.remove(keys, waiter)?;
            if keys.exists(q.queue) {
                value = with_mark(&value, unmarked, marked).unwrap_or(value);
            }
        }
        keys.set(lock, &value, ttl_ms.parse().ok());
        let (fence, _) = next_fence(keys, counter, &last, quantum, retention_ms);
        return Ok(array(vec![int(1), int(fence as i64)]));
    }
    if !waiter.is_empty() {
        let state = format!("{token} {ttl_ms} {grace_ms}");
        let created = q.enter(keys, waiter, &state, !previous.is_empty())?;
        q.keep(keys, grace_ms, created);
        mark_in_place(keys, lock, cur, unmarked, marked);
    }
    let cur = cur.map(str::to_owned);
    if let Some(other) = handed_to_another(keys, cur.as_deref(), q.states, handed)? {
        return Ok(other);
    }
    let pttl = keys.pttl(lock);
    if pttl < 0
        && let Some(first) = first_in_line(keys)?
    {
        let state = keys.hget(q.states, &first)?;
        return Ok(array(vec![int(2), bulk(&first), opt(state)]));
    }
    Ok(array(vec![int(0), int(pttl)]))
}

/// The first waiter in line that still has a state; the heads before it leave the queue.
fn first_live(keys: &mut Keyspace, q: &Queue<'_>) -> Result<Option<String>, WrongType> {
    loop {
        let Some((head, _)) = keys.zrange(q.queue, 0, 0)?.into_iter().next() else {
            return Ok(None);
        };
        if keys.hget(q.states, &head)?.is_some() {
            return Ok(Some(head));
        }
        keys.zrem(q.queue, &head)?;
    }
}

/// `ACQUIRE_UNQUEUED`.
pub(super) fn acquire_unqueued(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let (lock, counter) = (at(k, 0), at(k, 1));
    let (token, ttl_ms, quantum, retention_ms) = (at(a, 0), at(a, 1), at(a, 2), at(a, 3));
    let permits_mark = at(a, 4);
    match keys.get(lock) {
        Err(WrongType) => return Ok(array(vec![int(-1), bulk(keys.type_of(lock))])),
        Ok(Some(cur)) if cur.starts_with(permits_mark) => {
            return Ok(array(vec![int(-3), bulk(&cur)]));
        }
        Ok(Some(_)) => return Ok(array(vec![int(0), int(keys.pttl(lock))])),
        Ok(None) => keys.set(lock, token, ttl_ms.parse().ok()),
    }
    let last = keys.get(counter);
    if let Some(why) = unusable(&last) {
        keys.del(lock);
        return Ok(array(vec![int(-2), bulk(&why)]));
    }
    let (fence, _) = next_fence(keys, counter, &last, quantum, retention_ms);
    Ok(array(vec![int(1), int(fence as i64)]))
}

/// `RELEASE`.
pub(super) fn release(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let (lock, counter) = (at(k, 0), at(k, 3));
    let q = Queue {
        queue: at(k, 1),
        states: at(k, 2),
    };
    let mark_key = k.get(4).map(String::as_str);
    let permits: Vec<String> = k.get(5..).unwrap_or_default().to_vec();
    // ARGV[4] is the publish command: here every message is handed over in the process.
    let (token, retention_ms, record) = (at(a, 0), at(a, 1), at(a, 2));
    let (keep_ms, always, look) = (at(a, 4), at(a, 5), at(a, 6));
    let (unmarked, marked, kept, permits_mark) = (at(a, 11), at(a, 12), at(a, 13), at(a, 14));

    let free_key = |keys: &mut Keyspace| {
        keys.del(lock);
        if let Some(mark_key) = mark_key {
            free_mark(keys, mark_key, &permits, permits_mark);
        }
    };
    let hold_mark = |keys: &mut Keyspace, ms: i64| {
        if let Some(mark_key) = mark_key
            && keys.pttl(mark_key) < ms
        {
            keys.pexpire(mark_key, ms);
        }
    };
    let value = keys.get(lock).ok().flatten();
    let short = value.as_deref() == Some(token) && keep_ms == "0" && always == "0" && look == "0";
    if !short && !is_ours(value.as_deref(), token, unmarked, marked) {
        return Ok(int(0));
    }
    if let Some(mark_key) = mark_key
        && !holds_mark(keys, mark_key, &permits, permits_mark)
    {
        free_key(keys);
        keys.publish(at(a, 7), token);
        return Ok(int(0));
    }
    if record != "0" {
        raise_counter(keys, counter, record, retention_ms);
    }
    if short {
        free_key(keys);
        return Ok(int(1));
    }
    let keep = keep_ms.parse::<i64>().unwrap_or(0);
    if keep > 0 {
        keys.set(lock, &format!("{token}{kept}"), Some(keep as u64));
        hold_mark(keys, keep);
        return Ok(int(1));
    }
    let h = HandOver {
        key: lock,
        queue: q,
        counter,
        token,
        channel: at(a, 7),
        grant_prefix: at(a, 8),
        grants: at(a, 9),
        retention_ms,
        handed: at(a, 10),
        unmarked,
        marked,
        permit: at(a, 15),
    };
    if let Some(granted) = hand_over(keys, &h, &hold_mark, &free_key)? {
        return Ok(granted);
    }
    free_key(keys);
    if always == "1" {
        keys.publish(h.channel, token);
    }
    Ok(int(1))
}

/// `RELEASE_SHORT`.
pub(super) fn release_short(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let (lock, counter) = (at(k, 0), at(k, 1));
    let (token, retention_ms) = (at(a, 0), at(a, 1));
    let record = match at(a, 2) {
        "" => "0",
        record => record,
    };
    if keys.get(lock).ok().flatten().as_deref() != Some(token) {
        return Ok(int(0));
    }
    if record != "0" {
        raise_counter(keys, counter, record, retention_ms);
    }
    keys.del(lock);
    Ok(int(1))
}

/// `FENCE`.
pub(super) fn fence(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let (lock, counter) = (at(k, 0), at(k, 1));
    let (token, retention_ms, unmarked, marked) = (at(a, 0), at(a, 1), at(a, 2), at(a, 3));
    let value = keys.get(lock).ok().flatten();
    if !is_ours(value.as_deref(), token, unmarked, marked) {
        return Ok(array(vec![int(0)]));
    }
    let last = keys.get(counter);
    if let Some(why) = unusable(&last) {
        return Ok(array(vec![int(-2), bulk(&why)]));
    }
    let (fence, _) = next_fence(keys, counter, &last, "1", retention_ms);
    Ok(array(vec![int(1), int(fence as i64)]))
}

/// `RAISE_FENCE`.
pub(super) fn raise_fence(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let counter = at(k, 0);
    let (fence, retention_ms) = (at(a, 0), at(a, 1));
    let last = keys.get(counter);
    if let Some(why) = unusable(&last) {
        return Ok(array(vec![int(-2), bulk(&why)]));
    }
    let last = last.ok().flatten().and_then(|l| super::lib::number(&l));
    if last.unwrap_or(0.0) < super::lib::number(fence).unwrap_or(0.0) {
        super::lib::write_counter(keys, counter, fence, retention_ms);
    }
    Ok(int(1))
}
