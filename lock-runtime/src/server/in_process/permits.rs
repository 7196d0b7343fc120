//! The twins of the scripts of a lock with permits: `acquire_permit.lua` and
//! `forget_permit.lua`.

use super::lib::{
    Out, Queue, array, at, bulk, evict_stale_head, free_mark, int, is_ours, next_fence, opt,
    unless_foreign, unusable, with_mark,
};
use crate::transport::in_process::Keyspace;

/// `ACQUIRE_PERMIT`.
pub(super) fn acquire_permit(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let lock = at(k, 0);
    let q = Queue {
        queue: at(k, 2),
        states: at(k, 3),
    };
    let mark = at(a, 4);
    let Ok(cur) = keys.get(lock) else {
        return Ok(array(vec![int(-1), bulk(keys.type_of(lock))]));
    };
    if let Some(cur) = cur.as_deref().filter(|cur| *cur != mark) {
        return Ok(array(vec![int(-3), bulk(cur)]));
    }
    let out = attempt(keys, k, a, &q, cur.is_some());
    unless_foreign(keys, &q, out)
}

/// `ACQUIRE_PERMIT`'s `attempt`, on a name free or held by permits of this N (`held`).
fn attempt(keys: &mut Keyspace, k: &[String], a: &[String], q: &Queue<'_>, held: bool) -> Out {
    let permits: Vec<String> = k.get(4..).unwrap_or_default().to_vec();
    let (token, ttl_ms) = (at(a, 0), at(a, 1));
    let (waiter, grace_ms, evict, seen, previous) =
        (at(a, 5), at(a, 6), at(a, 7), at(a, 8), at(a, 9));
    let (handed, unmarked, marked) = (at(a, 10), at(a, 11), at(a, 12));
    evict_stale_head(keys, q, evict, seen, &permits, handed)?;
    let handed_here = format!("{handed}{waiter}");
    let is_mine = |value: &str| {
        !waiter.is_empty()
            && (value == handed_here
                || (!previous.is_empty()
                    && (value == previous
                        || with_mark(previous, unmarked, marked).as_deref() == Some(value))))
    };
    let Scan {
        free,
        mine,
        soonest,
    } = scan(keys, &permits, is_mine);
    // The live waiters queued before this caller, and the first of them: read only when a
    // permit is free (see `acquire_permit.lua`).
    let (mut ahead, mut first) = (0, None);
    if mine.is_none() && !free.is_empty() {
        for id in keys.zmembers(q.queue)? {
            if id == waiter {
                break;
            }
            if keys.hget(q.states, &id)?.is_some() {
                ahead += 1;
                first = first.or(Some(id));
            } else {
                keys.zrem(q.queue, &id)?;
            }
        }
    }
    let taken = mine.or_else(|| (ahead < free.len()).then(|| free[0]));
    if let Some(taken) = taken {
        return take(keys, k, a, q, (&permits[taken], taken), held);
    }
    if !waiter.is_empty() {
        q.join(
            keys,
            waiter,
            &format!("{token} {ttl_ms} {grace_ms}"),
            grace_ms,
        )?;
    }
    if let (false, Some(first)) = (free.is_empty(), first) {
        let state = keys.hget(q.states, &first)?;
        return Ok(array(vec![int(2), bulk(&first), opt(state)]));
    }
    Ok(array(vec![int(0), int(soonest.unwrap_or(-1))]))
}

/// The caller takes `permit` (its key and index); the lock's key holds the permits' mark as
/// long as the longest lease of the permits' holders (`marked`: it does already).
fn take(
    keys: &mut Keyspace,
    k: &[String],
    a: &[String],
    q: &Queue<'_>,
    (permit, index): (&str, usize),
    marked: bool,
) -> Out {
    let (lock, counter) = (at(k, 0), at(k, 1));
    let (token, ttl_ms, quantum, retention_ms) = (at(a, 0), at(a, 1), at(a, 2), at(a, 3));
    let (mark, waiter) = (at(a, 4), at(a, 5));
    let last = keys.get(counter);
    if let Some(why) = unusable(&last) {
        return Ok(array(vec![int(-2), bulk(&why)]));
    }
    let ttl = ttl_ms.parse::<i64>().unwrap_or(0);
    // Out of the queue before the permit is written (see `acquire_permit.lua`).
    if !waiter.is_empty() {
        q.remove(keys, waiter)?;
    }
    keys.set(permit, token, Some(ttl as u64));
    if !marked {
        keys.set(lock, mark, Some(ttl as u64));
    } else if keys.pttl(lock) < ttl {
        keys.pexpire(lock, ttl);
    }
    let (fence, _) = next_fence(keys, counter, &last, quantum, retention_ms);
    Ok(array(vec![int(1), int(fence as i64), int(index as i64)]))
}

/// What the permits' keys hold: the free ones, the one handed to the caller, and the least
/// time left of the others.
struct Scan {
    free: Vec<usize>,
    mine: Option<usize>,
    soonest: Option<i64>,
}

fn scan(keys: &mut Keyspace, permits: &[String], is_mine: impl Fn(&str) -> bool) -> Scan {
    let mut out = Scan {
        free: Vec::new(),
        mine: None,
        soonest: None,
    };
    for (i, permit) in permits.iter().enumerate() {
        match keys.get(permit).ok().flatten() {
            None => out.free.push(i),
            Some(value) if is_mine(&value) => out.mine = Some(i),
            Some(_) => {
                let pttl = keys.pttl(permit);
                if pttl >= 0 && out.soonest.is_none_or(|s| pttl < s) {
                    out.soonest = Some(pttl);
                }
            }
        }
    }
    out
}

/// `FORGET_PERMIT`.
pub(super) fn forget_permit(keys: &mut Keyspace, k: &[String], a: &[String]) -> Out {
    let lock = at(k, 0);
    let permits: Vec<String> = k.get(1..).unwrap_or_default().to_vec();
    let (token, channel) = (at(a, 0), at(a, 1));
    let (unmarked, marked, permits_mark) = (at(a, 3), at(a, 4), at(a, 5));
    let freed = permits.iter().find(|permit| {
        let value = keys.get(permit).ok().flatten();
        is_ours(value.as_deref(), token, unmarked, marked)
    });
    let Some(permit) = freed.cloned() else {
        return Ok(int(0));
    };
    keys.del(&permit);
    keys.publish(channel, token);
    free_mark(keys, lock, &permits, permits_mark);
    Ok(int(1))
}
