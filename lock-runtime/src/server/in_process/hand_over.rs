//! The twin of `lua/lib/hand_over.lua`: a released lock handed to the first live waiter.

use redis::Value;

use super::lib::{Queue, bulk, exclusive_state, int, next_fence, short_state, unusable, with_mark};
use crate::transport::in_process::{Keyspace, WrongType};

/// What a hand-over needs besides the keyspace (see `hand_over.lua`'s `k` and `a`).
pub(super) struct HandOver<'a> {
    pub key: &'a str,
    pub queue: Queue<'a>,
    pub counter: &'a str,
    pub token: &'a str,
    pub channel: &'a str,
    pub grant_prefix: &'a str,
    pub grants: &'a str,
    pub retention_ms: &'a str,
    pub handed: &'a str,
    pub unmarked: &'a str,
    pub marked: &'a str,
    pub permit: &'a str,
}

/// What follows the last `marker` in `text`, when that is one or more letters or digits.
fn tail_after<'t>(text: &'t str, marker: &str) -> Option<&'t str> {
    let at = text.rfind(marker)?;
    let rest = &text[at + marker.len()..];
    (!rest.is_empty() && rest.chars().all(char::is_alphanumeric)).then_some(rest)
}

/// With waiters queued, grants the key to the first live one and returns the reply; `None`
/// when nobody queues. `hold_mark(ms)` keeps a permit's lock key marked, `free_key` deletes.
pub(super) fn hand_over(
    keys: &mut Keyspace,
    h: &HandOver<'_>,
    hold_mark: &dyn Fn(&mut Keyspace, i64),
    free_key: &dyn Fn(&mut Keyspace),
) -> Result<Option<Value>, WrongType> {
    let line = keys.zrange(h.queue.queue, 0, 1).unwrap_or_default();
    let Some(head) = line.first().map(|(m, _)| m.clone()) else {
        return Ok(None);
    };
    let state = keys.hget(h.queue.states, &head)?;
    let last = keys.get(h.counter);
    let granted = state
        .as_deref()
        .and_then(exclusive_state)
        .filter(|_| unusable(&last).is_none());
    if let Some((nonce, grace)) = granted {
        let (nonce, grace) = (nonce.to_owned(), grace.parse::<i64>().unwrap_or(0));
        h.queue.remove(keys, &head)?;
        let held = match line.len() > 1 {
            true => with_mark(&nonce, h.unmarked, h.marked).unwrap_or_else(|| nonce.clone()),
            false => nonce.clone(),
        };
        keys.set(h.key, &held, Some(grace as u64));
        hold_mark(keys, grace);
        let (fence, _) = next_fence(keys, h.counter, &last, "1", h.retention_ms);
        let mut grant = format!("{}{head} {nonce} {fence}", h.handed);
        if !h.permit.is_empty() {
            grant = format!("{grant} {}", h.permit);
        }
        let via = match tail_after(&head, h.grants) {
            Some(via) => format!("{}{via}", h.grant_prefix),
            None => h.channel.to_owned(),
        };
        keys.publish(&via, &grant);
        return Ok(Some(bulk(&grant)));
    }
    if let Some(by_id) = state.as_deref().and_then(short_state) {
        let by_id = by_id.parse::<i64>().unwrap_or(0);
        h.queue.remove(keys, &head)?;
        let value = format!("{}{head}", h.handed);
        keys.set(h.key, &value, Some(by_id as u64));
        hold_mark(keys, by_id);
        keys.publish(h.channel, &value);
        return Ok(Some(bulk(&value)));
    }
    free_key(keys);
    keys.publish(h.channel, h.token);
    Ok(Some(int(1)))
}
