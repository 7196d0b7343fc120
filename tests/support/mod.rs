//! Shared helpers of the integration tests: a private server, a raw connection, bounded waits,
//! the waiter queue of a lock, a seedable random source, and a guard for tests that must not
//! overlap.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use lock_runtime::{LockOptions, Locker};
use lock_testing::RedisServer;
use redis::aio::MultiplexedConnection;

/// The fenced store and its history checker (fault tests).
pub mod fenced;
/// `lock_holder` child processes (fault tests).
pub mod holder;
/// The commands a server runs, with their arguments (`MONITOR`).
pub mod monitor;
/// Several independent nodes, for Redlock.
pub mod nodes;

/// A private redis-server with a locker and a raw connection to it.
pub struct Env {
    pub server: RedisServer,
    pub locker: Locker,
    pub raw: MultiplexedConnection,
}

impl Env {
    pub async fn start() -> Self {
        let server = RedisServer::start();
        let locker = Locker::connect(&server.url())
            .await
            .expect("locker connects");
        let raw = raw_connection(&server.url()).await;
        Self {
            server,
            locker,
            raw,
        }
    }

    /// Another locker with its own connections to the same server.
    pub async fn second_locker(&self) -> Locker {
        Locker::connect(&self.server.url())
            .await
            .expect("second locker connects")
    }

    pub fn key(&self, name: &str) -> String {
        self.locker.key_of(name)
    }

    pub async fn exists(&self, key: &str) -> bool {
        let mut raw = self.raw.clone();
        redis::cmd("EXISTS")
            .arg(key)
            .query_async::<i64>(&mut raw)
            .await
            .unwrap()
            == 1
    }

    pub async fn pttl(&self, key: &str) -> i64 {
        let mut raw = self.raw.clone();
        redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap()
    }

    /// How many clients are subscribed to `channel` (PUBSUB NUMSUB).
    pub async fn subscribers(&self, channel: &str) -> i64 {
        subscribers(&self.raw, channel).await
    }

    /// The channels anyone is subscribed to on the server (PUBSUB CHANNELS), sorted.
    pub async fn pubsub_channels(&self) -> Vec<String> {
        pubsub_channels(&self.raw).await
    }

    pub async fn get(&self, key: &str) -> Option<String> {
        let mut raw = self.raw.clone();
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap()
    }

    pub async fn del(&self, key: &str) {
        let mut raw = self.raw.clone();
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap();
    }

    pub async fn reset_stats(&self) {
        reset_stats(&self.raw).await;
    }

    /// How many times `command` ran since the last reset (from INFO commandstats).
    pub async fn calls(&self, command: &str) -> u64 {
        calls(&self.raw, command).await
    }
}

/// Resets the server's command counts (CONFIG RESETSTAT), over `raw`.
pub async fn reset_stats(raw: &MultiplexedConnection) {
    let mut raw = raw.clone();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// How many times `command` ran since the last reset (from INFO commandstats), asked over `raw`.
pub async fn calls(raw: &MultiplexedConnection, command: &str) -> u64 {
    let mut raw = raw.clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// A locked section's failure: the lock's or the fenced store's.
#[derive(Debug)]
pub enum Failure {
    Lock(lock_runtime::LockError),
    Store(redis::RedisError),
}

impl From<lock_runtime::LockError> for Failure {
    fn from(e: lock_runtime::LockError) -> Self {
        Self::Lock(e)
    }
}

impl From<redis::RedisError> for Failure {
    fn from(e: redis::RedisError) -> Self {
        Self::Store(e)
    }
}

/// How many clients are subscribed to `channel` (PUBSUB NUMSUB), asked over `raw`.
pub async fn subscribers(raw: &MultiplexedConnection, channel: &str) -> i64 {
    let mut raw = raw.clone();
    let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut raw)
        .await
        .unwrap();
    n[0].1
}

/// The channels anyone is subscribed to on the server (PUBSUB CHANNELS), sorted, asked over
/// `raw`.
pub async fn pubsub_channels(raw: &MultiplexedConnection) -> Vec<String> {
    let mut raw = raw.clone();
    let mut channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(&mut raw)
        .await
        .unwrap();
    channels.sort();
    channels
}

/// The id of the first waiter queued on `key`, and the grant channel it names
/// (`<key>:released:<id>` for an id ending with `;grants=<id>`).
pub async fn first_waiter(raw: &MultiplexedConnection, key: &str) -> (String, String) {
    let mut raw = raw.clone();
    let head: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("{key}:waiters"))
        .arg(0)
        .arg(0)
        .query_async(&mut raw)
        .await
        .unwrap();
    let (_, grants) = head[0]
        .rsplit_once(";grants=")
        .expect("a waiter id names its locker's grant channel");
    let channel = format!("{key}:released:{grants}");
    (head[0].clone(), channel)
}

pub async fn raw_connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A RESP3 connection pattern-subscribed to `pattern`, and the messages it receives, as
/// (channel, payload), in the order the server sent them.
pub async fn listen(
    url: &str,
    pattern: &str,
) -> (
    MultiplexedConnection,
    tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
) {
    let (pushes, mut received) = tokio::sync::mpsc::unbounded_channel::<redis::PushInfo>();
    let config = redis::AsyncConnectionConfig::new().set_push_sender(pushes);
    let mut conn = redis::Client::open(format!("{url}?protocol=resp3"))
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    conn.psubscribe(pattern).await.unwrap();
    let (messages, out) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(push) = received.recv().await {
            if push.kind != redis::PushKind::PMessage {
                continue;
            }
            let text = |v: &redis::Value| redis::from_redis_value_ref::<String>(v).unwrap();
            let (channel, payload) = (text(&push.data[1]), text(&push.data[2]));
            if messages.send((channel, payload)).is_err() {
                break;
            }
        }
    });
    (conn, out)
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

/// Sets the lock `key` to `value` for `ttl`, as a holder (or another client) would.
pub async fn set_for(env: &Env, key: &str, value: &str, ttl: Duration) {
    let mut raw = env.raw.clone();
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(ttl.as_millis() as u64)
        .query_async(&mut raw)
        .await
        .unwrap();
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

/// A waiter that takes the lock `name`, releases it at once and returns its fence.
pub fn take_and_release(
    locker: Locker,
    name: &'static str,
    o: LockOptions,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let lease = locker.acquire(name, &o).await.unwrap();
        let fence = lease.fence();
        lease.release().await.unwrap();
        fence
    })
}

/// How many waiters the queue of the lock `name` holds.
pub async fn queue_len(env: &Env, name: &str) -> i64 {
    let mut raw = env.raw.clone();
    redis::cmd("ZCARD")
        .arg(format!("{}:waiters", env.key(name)))
        .query_async(&mut raw)
        .await
        .unwrap()
}

/// Taken by the tests of one file that must not overlap: each test file is a process of its
/// own, so this orders the tests of that file only (they time real events, or capture logs).
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// xorshift64*: small, seedable, good enough to pick faults and operations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A duration from `lo` to `hi` ms, both included.
    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        ms(lo + self.below(hi - lo + 1))
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

pub fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::new(Duration::from_millis(ttl_ms))
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Polls `check` every millisecond until it holds; panics with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Runs `fut` with a tracing subscriber that records every event as "level target: fields".
pub async fn capture_logs<F: Future>(fut: F) -> Vec<String> {
    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let dispatch = tracing::Dispatch::new(Recorder(logs.clone()));
    let guard = tracing::dispatcher::set_default(&dispatch);
    fut.await;
    drop(guard);
    logs.lock().unwrap().clone()
}

struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(format!(
            "{} {}:",
            event.metadata().level(),
            event.metadata().target()
        ));
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
