//! The twins of the scripts of a shared hold: `acquire_shared.lua` and `release_shared.lua`.

use super::hand_over::{HandOver, hand_over};
use super::lib::{
    Out, Queue, array, at, bulk, evict_stale_head, foreign, handed_to_another, int, is_ours,
    mark_in_place, next_fence, opt, short_state, starts_with, unless_foreign, unusable,
};
use crate::transport::in_process::{Keyspace, WrongType};

/// Whether `state` is a shared waiter's (`<nonce> <grace ms>`; an exclusive one's has a ttl
/// too).
fn shared_state(state: Option<&str>) -> bool {
    state.and_then(short_state).is_some()
}

/// `ACQUIRE_SHARED`: the holders' set checked first (a new hold deletes it), then the attempt,
/// or the queue's key of another type that one of its commands met.
pub(super) fn acquire_shared(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    if let Some(refused) = foreign(keys, at(k, 4), "zset") {
        return Ok(refused);
    }
    let q = Queue {
        queue: at(k, 2),
        states: at(k, 3),
    };
    let out = attempt(keys, k, a, &q);
    unless_foreign(keys, &q, out)
}

/// `ACQUIRE_SHARED`'s `attempt`.
fn attempt(keys: &mut Keyspace, k: &[String], a: &[String], q: &Queue<'_>) -> Out {
    let lock = at(k, 0);
    let (token, grace_ms) = (at(a, 0), at(a, 7));
    let (waiter, evict, seen) = (at(a, 6), at(a, 8), at(a, 9));
    let (handed, unmarked, marked) = (at(a, 10), at(a, 11), at(a, 12));
    let (shared_mark, permits_mark) = (at(a, 13), at(a, 14));

    evict_stale_head(keys, q, evict, seen, &[lock.to_owned()], handed)?;
    let Ok(cur) = keys.get(lock) else {
        return Ok(array(vec![int(-1), bulk(keys.type_of(lock))]));
    };
    if starts_with(cur.as_deref(), permits_mark) {
        return Ok(array(vec![int(-3), opt(cur)]));
    }
    let shared = starts_with(cur.as_deref(), shared_mark);
    let ours = !waiter.is_empty() && cur.as_deref() == Some(&format!("{handed}{waiter}"));
    // Read only when the key is free or shared (see `acquire_shared.lua`).
    let (ahead, first) = if !ours && (cur.is_none() || shared) {
        exclusive_ahead(keys, q, waiter)?
    } else {
        (false, None)
    };
    if ours || ((cur.is_none() || shared) && !ahead) {
        return join(keys, k, a, q, cur.filter(|_| shared));
    }
    if !waiter.is_empty() {
        q.join(keys, waiter, &format!("{token} {grace_ms}"), grace_ms)?;
        if !shared {
            mark_in_place(keys, lock, cur.as_deref(), unmarked, marked);
        }
    }
    if let Some(other) = handed_to_another(keys, cur.as_deref(), q.states, handed)? {
        return Ok(other);
    }
    if let (None, Some(first)) = (&cur, first) {
        let state = keys.hget(q.states, &first)?;
        return Ok(array(vec![int(2), bulk(&first), opt(state)]));
    }
    Ok(array(vec![int(0), int(keys.pttl(lock))]))
}

/// Whether an exclusive waiter is queued before `waiter`; the first live one in line. Heads
/// without a state leave the queue.
fn exclusive_ahead(
    keys: &mut Keyspace,
    q: &Queue<'_>,
    waiter: &str,
) -> Result<(bool, Option<String>), WrongType> {
    let mut first = None;
    for id in keys.zmembers(q.queue)? {
        if id == waiter {
            break;
        }
        match keys.hget(q.states, &id)? {
            Some(state) => {
                first = first.or(Some(id));
                if !shared_state(Some(&state)) {
                    return Ok((true, first));
                }
            }
            None => keys.zrem(q.queue, &id)?,
        }
    }
    Ok((false, first))
}

/// The caller joins the shared hold `cur` (none: starts one), with its place among the
/// holders, which ends with its own lease; the places of holders whose lease ran out go.
fn join(
    keys: &mut Keyspace,
    k: &[String],
    a: &[String],
    q: &Queue<'_>,
    cur: Option<String>,
) -> Out {
    let (lock, counter, readers) = (at(k, 0), at(k, 1), at(k, 4));
    let (token, ttl_ms, quantum, retention_ms) = (at(a, 0), at(a, 1), at(a, 2), at(a, 3));
    let (channel, waiter, shared_mark) = (at(a, 5), at(a, 6), at(a, 13));
    let last = keys.get(counter);
    if let Some(why) = unusable(&last) {
        return Ok(array(vec![int(-2), bulk(&why)]));
    }
    let ttl = ttl_ms.parse::<i64>().unwrap_or(0);
    // Out of the queue before the key is written (see `acquire_shared.lua`).
    if !waiter.is_empty() {
        q.remove(keys, waiter)?;
    }
    let cur = match cur {
        None => {
            let cur = format!("{shared_mark}{token}");
            keys.del(readers);
            keys.set(lock, &cur, Some(ttl as u64));
            cur
        }
        Some(cur) => {
            if keys.pttl(lock) < ttl {
                keys.pexpire(lock, ttl);
            }
            cur
        }
    };
    let (fence, (s, us)) = next_fence(keys, counter, &last, quantum, retention_ms);
    let ms = s * 1000 + us / 1000;
    let member = format!("{token} {fence}");
    keys.zadd(readers, (ms + ttl as u64) as f64, &member, false, false)?;
    keys.zrem_up_to(readers, ms as f64)?;
    if keys.pttl(readers) < ttl {
        keys.pexpire(readers, ttl);
    }
    // Shared waiters next in line join too: woken.
    if let Some((next, _)) = keys.zrange(q.queue, 0, 0)?.into_iter().next()
        && shared_state(keys.hget(q.states, &next)?.as_deref())
    {
        keys.publish(channel, &cur);
    }
    Ok(array(vec![
        int(1),
        int(fence as i64),
        bulk(&cur),
        bulk(&member),
    ]))
}

/// `RELEASE_SHARED`.
pub(super) fn release_shared(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let (lock, readers, counter) = (at(k, 0), at(k, 1), at(k, 4));
    let q = Queue {
        queue: at(k, 2),
        states: at(k, 3),
    };
    let (mut token, mut member) = (at(a, 0).to_owned(), at(a, 1).to_owned());
    let (retention_ms, keep_ms, channel) = (at(a, 2), at(a, 4), at(a, 5));
    let (unmarked, marked, kept, shared_mark) = (at(a, 9), at(a, 10), at(a, 11), at(a, 12));

    let value = keys.get(lock).ok().flatten();
    let Some(value) = value.filter(|v| v.starts_with(shared_mark)) else {
        return Ok(int(0));
    };
    if token.is_empty() {
        token.clone_from(&value);
    }
    if !is_ours(Some(&value), &token, unmarked, marked) || keys.type_of(readers) != "zset" {
        return Ok(int(0));
    }
    // Holders whose lease ran out (dead ones) leave first.
    let now = keys.now_ms() as f64;
    keys.zrem_up_to(readers, now)?;
    if keys.zscore(readers, &member)?.is_none() {
        // Only the token is known: its place is the member that starts with it.
        let prefix = format!("{member} ");
        let found = keys
            .zmembers(readers)?
            .into_iter()
            .find(|m| m.starts_with(&prefix));
        let Some(found) = found else {
            return Ok(int(0));
        };
        member = found;
    }
    keys.zrem(readers, &member)?;
    if let Some((_, longest)) = keys.zrange(readers, -1, -1)?.into_iter().next() {
        let left = (longest - now) as i64;
        if keys.pttl(lock) > left {
            keys.pexpire(lock, left);
            if keys.exists(q.queue) {
                keys.publish(channel, &value);
            }
        }
        return Ok(int(1));
    }
    keys.del(readers);
    let holder = member.split(' ').next().unwrap_or_default().to_owned();
    let keep = keep_ms.parse::<i64>().unwrap_or(0);
    if keep > 0 {
        keys.set(lock, &format!("{holder}{kept}"), Some(keep as u64));
        return Ok(int(1));
    }
    let free_key = |keys: &mut Keyspace| {
        keys.del(lock);
    };
    let h = HandOver {
        key: lock,
        queue: q,
        counter,
        token: &token,
        channel,
        grant_prefix: at(a, 6),
        grants: at(a, 7),
        retention_ms,
        handed: at(a, 8),
        unmarked,
        marked,
        permit: "",
    };
    if let Some(granted) = hand_over(keys, &h, &|_, _| {}, &free_key)? {
        return Ok(granted);
    }
    free_key(keys);
    Ok(int(1))
}
