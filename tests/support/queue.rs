//! The waiter queue of a lock (`<key>:waiters`, and its states in `<key>:waiters:state`): read,
//! waited for, and written from the side as a waiter of another client would.

use std::time::Duration;

use lock_runtime::Locker;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;

use super::{Env, eventually, ms, opts, query, take_and_release};

/// The id of the first waiter queued on `key`, and the grant channel it names
/// (`<key>:released:<id>` for an id ending with `;grants=<id>`).
pub async fn first_waiter(raw: &MultiplexedConnection, key: &str) -> (String, String) {
    let head: Vec<String> = query(
        raw,
        redis::cmd("ZRANGE")
            .arg(format!("{key}:waiters"))
            .arg(0)
            .arg(0),
    )
    .await;
    let (_, grants) = head[0]
        .rsplit_once(";grants=")
        .expect("a waiter id names its locker's grant channel");
    let channel = format!("{key}:released:{grants}");
    (head[0].clone(), channel)
}

/// Puts waiter `id` first in the queue of the lock `key`, as a waiter whose queue state has no
/// ttl and that then stopped coming back: a last attempt's nonce and a grace of 300 ms.
pub async fn queue_stalled_waiter(env: &Env, key: &str, id: &str) {
    queue_waiter(env, key, id, "nonce 300").await;
}

/// Puts waiter `id` first in the queue of the lock `key`, with `state` as its attempt would
/// write it (`<nonce> <ttl ms> <grace ms>`, or `<nonce> <grace ms>` for a state without a ttl).
pub async fn queue_waiter(env: &Env, key: &str, id: &str, state: &str) {
    let mut raw = env.raw.clone();
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(format!("{key}:waiters"))
        .arg(1)
        .arg(id)
        .ignore()
        .cmd("HSET")
        .arg(format!("{key}:waiters:state"))
        .arg(id)
        .arg(state)
        .ignore()
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// A [`take_and_release`] task on `locker` for the lock `name` (ttl 10 s, waiting up to `wait`),
/// returned once the queue holds `n` waiters: it queued, as the `n`th.
pub async fn queue_taker(
    env: &Env,
    locker: Locker,
    name: &'static str,
    wait: Duration,
    n: i64,
) -> JoinHandle<u64> {
    let waiter = take_and_release(locker, name, opts(10_000).with_wait(wait));
    queued(env, name, n).await;
    waiter
}

/// Waits (bounded) until the queue of the lock `name` holds `n` waiters.
pub async fn queued(env: &Env, name: &str, n: i64) {
    eventually(
        ms(2_000),
        &format!("{n} waiters queued on {name}"),
        || async { queue_len(env, name).await == n },
    )
    .await;
}

/// How many waiters the queue of the lock `name` holds.
pub async fn queue_len(env: &Env, name: &str) -> i64 {
    query(
        &env.raw,
        redis::cmd("ZCARD").arg(format!("{}:waiters", env.key(name))),
    )
    .await
}
