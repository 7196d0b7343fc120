//! Shared helpers of the integration tests: a private server, raw connections and queries, lock
//! calls that tests repeat, bounded waits and timings, assertions on errors, a seedable random
//! source, a log capture, and a guard for tests that must not overlap.
//!
//! Each test binary declares this module public (`#[path] pub mod support;`): these helpers are
//! the suite's shared interface, so that a binary that uses only some of them is not warned about
//! the others. A helper that no test uses is deleted, not kept.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_runtime::{Lease, LockError, LockOptions, Locker, LockerBuilder, LostReason};
use lock_testing::RedisServer;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The kinds of deployment the behaviours run on, started once per process.
pub mod deployments;
/// The fenced store, as the test process and the `lock_holder` binary both use it.
pub mod fenced;
/// The fenced store's set-up, read-back and history checker (test side only).
pub mod history;
/// `lock_holder` child processes (fault tests).
pub mod holder;
/// The commands a server runs, with their arguments (`MONITOR`).
pub mod monitor;
/// Several independent nodes, for Redlock.
pub mod nodes;
/// The waiter queue of a lock, seen and written from the side.
pub mod queue;

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

    /// Another locker on the same server, connected with the settings `configure` adds.
    pub async fn locker_with(
        &self,
        configure: impl FnOnce(LockerBuilder) -> LockerBuilder,
    ) -> Locker {
        connect_with(&self.server.url(), configure).await
    }

    pub fn key(&self, name: &str) -> String {
        self.locker.key_of(name)
    }

    pub async fn exists(&self, key: &str) -> bool {
        exists(&self.raw, key).await
    }

    pub async fn pttl(&self, key: &str) -> i64 {
        query(&self.raw, redis::cmd("PTTL").arg(key)).await
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
        query(&self.raw, redis::cmd("GET").arg(key)).await
    }

    pub async fn del(&self, key: &str) {
        let _: i64 = query(&self.raw, redis::cmd("DEL").arg(key)).await;
    }

    pub async fn reset_stats(&self) {
        reset_stats(&self.raw).await;
    }

    /// How many times `command` ran since the last reset (from INFO commandstats).
    pub async fn calls(&self, command: &str) -> u64 {
        calls(&self.raw, command).await
    }
}

/// A locker on `url`, connected with the settings `configure` adds to its builder.
pub async fn connect_with(
    url: &str,
    configure: impl FnOnce(LockerBuilder) -> LockerBuilder,
) -> Locker {
    configure(Locker::builder().url(url))
        .connect()
        .await
        .expect("locker connects")
}

pub async fn raw_connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A raw connection to the redis-server on `127.0.0.1:port`.
pub async fn raw_connection_to(port: u16) -> MultiplexedConnection {
    raw_connection(&format!("redis://127.0.0.1:{port}")).await
}

/// Fails when a key of `server` has no expiry (`PTTL` -1), naming each such key and its type.
/// Every key the engine writes expires by itself (a lock's key, its permits, its shared holders,
/// its queue, its fence counter and agreed count after `fence_retention`), so that names used
/// once leave nothing behind for good. Only `fence_retention(None)` keeps counters forever: a
/// test of that does not call this. Call it once the test's lockers are done.
pub async fn assert_every_key_expires(server: &RedisServer) {
    let forever = keys_without_expiry(&server.url()).await;
    assert!(
        forever.is_empty(),
        "keys without an expiry on {}: {}",
        server.url(),
        forever.join(", ")
    );
}

/// The keys of the server at `url` that have no expiry, each as `key (type)`, sorted (SCAN: no
/// `KEYS`, which would block a server of many keys).
pub async fn keys_without_expiry(url: &str) -> Vec<String> {
    let raw = raw_connection(url).await;
    let mut forever = Vec::new();
    let mut cursor = 0u64;
    loop {
        let scan = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1_000)
            .clone();
        let (next, keys): (u64, Vec<String>) = query(&raw, &scan).await;
        for key in keys {
            let pttl: i64 = query(&raw, redis::cmd("PTTL").arg(&key)).await;
            if pttl == -1 {
                let kind: String = query(&raw, redis::cmd("TYPE").arg(&key)).await;
                forever.push(format!("{key} ({kind})"));
            }
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    forever.sort();
    forever
}

/// Sends `cmd` over `raw` and returns the reply; panics on an error reply.
pub async fn query<T: redis::FromRedisValue>(raw: &MultiplexedConnection, cmd: &redis::Cmd) -> T {
    cmd.query_async(&mut raw.clone())
        .await
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Whether `key` exists, asked over `raw`.
pub async fn exists(raw: &MultiplexedConnection, key: &str) -> bool {
    query::<i64>(raw, redis::cmd("EXISTS").arg(key)).await == 1
}

/// Loads both release scripts on the server behind `locker`, through a lock named after `name`
/// (a first EVALSHA of a script is sent twice): a plain release sends the short one, a release
/// that keeps its key a moment (`min_hold`) the whole one. Each call takes a name of its own.
pub async fn warm_release_scripts(locker: &Locker, name: &str) {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!("{name}:{}", CALLS.fetch_add(1, Ordering::Relaxed));
    let ttl = Duration::from_secs(10);
    for min_hold in [Duration::ZERO, Duration::from_millis(200)] {
        let opts = LockOptions::new(ttl).with_min_hold(min_hold);
        let lease = locker.acquire(&name, &opts).await.unwrap();
        lease.release().await.unwrap();
    }
}

/// Resets the server's command counts (CONFIG RESETSTAT), over `raw`.
pub async fn reset_stats(raw: &MultiplexedConnection) {
    let () = query(raw, redis::cmd("CONFIG").arg("RESETSTAT")).await;
}

/// How many times `command` ran since the last reset (from INFO commandstats), asked over `raw`.
pub async fn calls(raw: &MultiplexedConnection, command: &str) -> u64 {
    let info: String = query(raw, redis::cmd("INFO").arg("commandstats")).await;
    calls_in(&info, command)
}

/// How many times `command` ran, as `INFO commandstats` (the text `info`) counts it.
pub fn calls_in(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// How many clients are subscribed to `channel` (PUBSUB NUMSUB), asked over `raw`.
pub async fn subscribers(raw: &MultiplexedConnection, channel: &str) -> i64 {
    let n: Vec<(String, i64)> = query(raw, redis::cmd("PUBSUB").arg("NUMSUB").arg(channel)).await;
    n[0].1
}

/// The channels anyone is subscribed to on the server (PUBSUB CHANNELS), sorted, asked over
/// `raw`.
pub async fn pubsub_channels(raw: &MultiplexedConnection) -> Vec<String> {
    let mut channels: Vec<String> = query(raw, redis::cmd("PUBSUB").arg("CHANNELS")).await;
    channels.sort();
    channels
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

/// Sets the lock `key` to `value` for `ttl`, as a holder (or another client) would.
pub async fn set_for(env: &Env, key: &str, value: &str, ttl: Duration) {
    let px = ttl.as_millis() as u64;
    let () = query(
        &env.raw,
        redis::cmd("SET").arg(key).arg(value).arg("PX").arg(px),
    )
    .await;
}

/// A locked section's failure: the lock's or the fenced store's.
#[derive(Debug)]
pub enum Failure {
    Lock(LockError),
    Store(redis::RedisError),
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

impl From<redis::RedisError> for Failure {
    fn from(e: redis::RedisError) -> Self {
        Self::Store(e)
    }
}

/// A task that waits (as `o` allows) for the lock `name`: the lease, or why not.
pub fn spawn_acquire(
    locker: &Locker,
    name: &str,
    o: LockOptions,
) -> JoinHandle<Result<Lease, LockError>> {
    let (locker, name) = (locker.clone(), name.to_owned());
    tokio::spawn(async move { locker.acquire(&name, &o).await })
}

/// A locked call on a task of its own whose body sleeps 5 s, then notes that it ran to its end:
/// for the tests of a fault that must end the body first.
pub struct SleepingBody {
    call: JoinHandle<Result<(), LockError>>,
    finished: Arc<AtomicBool>,
}

impl SleepingBody {
    /// Starts the call on the lock `name`; returns once the body runs, with the lease's fence.
    pub async fn start(locker: &Locker, name: &str, o: LockOptions) -> (Self, u64) {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let finished = Arc::new(AtomicBool::new(false));
        let call = {
            let (locker, name, finished) = (locker.clone(), name.to_owned(), finished.clone());
            tokio::spawn(async move {
                locker
                    .run(&name, &o, async |lease| {
                        started_tx.send(lease.fence()).unwrap();
                        tokio::time::sleep(ms(5_000)).await;
                        finished.store(true, Ordering::SeqCst);
                    })
                    .await
            })
        };
        let fence = started_rx.await.unwrap();
        (Self { call, finished }, fence)
    }

    /// Waits for the call's end, which must come before the body's: its outcome, and how long
    /// the wait took.
    pub async fn cut_short(self) -> (Result<(), LockError>, Duration) {
        let (res, took) = timed(self.call).await;
        assert!(
            !self.finished.load(Ordering::SeqCst),
            "the body ran to its end"
        );
        (res.unwrap(), took)
    }
}

/// Takes the lock `name` and releases it at once; returns the lease's fence.
pub async fn cycle(locker: &Locker, name: &str, o: &LockOptions) -> u64 {
    let lease = locker.acquire(name, o).await.unwrap();
    let fence = lease.fence();
    lease.release().await.unwrap();
    fence
}

/// `n` cycles of the lock `name`, one after the other: their fences, in order. Each acquire is
/// retried (for up to 5 s) while it fails with an error `retry` accepts.
pub async fn cycles(
    locker: &Locker,
    name: &str,
    o: &LockOptions,
    n: usize,
    retry: impl Fn(&LockError) -> bool,
) -> Vec<u64> {
    let mut fences = Vec::with_capacity(n);
    for _ in 0..n {
        let lease = acquire_retrying(locker, name, o, &retry).await.unwrap();
        fences.push(lease.fence());
        lease.release().await.unwrap();
    }
    fences
}

/// A task that takes the lock `name` (waiting as `o` allows), releases it at once and returns
/// its fence.
pub fn take_and_release(locker: Locker, name: &'static str, o: LockOptions) -> JoinHandle<u64> {
    tokio::spawn(async move { cycle(&locker, name, &o).await })
}

/// Acquires the lock `name`, retrying for up to 5 s while the attempt fails with an error `retry`
/// accepts (a connection still reconnecting, nodes coming back); any other outcome is returned.
pub async fn acquire_retrying(
    locker: &Locker,
    name: &str,
    o: &LockOptions,
    retry: impl Fn(&LockError) -> bool,
) -> Result<Lease, LockError> {
    let until = Instant::now() + ms(5_000);
    loop {
        match locker.acquire(name, o).await {
            Err(e) if retry(&e) && Instant::now() < until => tokio::time::sleep(ms(10)).await,
            other => return other,
        }
    }
}

/// Takes every lock of `names` at once (a task each), and returns the leases in that order.
pub async fn acquire_all(
    locker: &Locker,
    names: impl Iterator<Item = String>,
    o: LockOptions,
) -> Vec<Lease> {
    let tasks: Vec<_> = names
        .map(|name| {
            let locker = locker.clone();
            tokio::spawn(async move { locker.acquire(&name, &o).await.unwrap() })
        })
        .collect();
    let mut leases = Vec::with_capacity(tasks.len());
    for t in tasks {
        leases.push(t.await.unwrap());
    }
    leases
}

/// Takes the lock `name` (waiting as `o` allows): the lease, and how long it took.
pub async fn acquire_timed(locker: &Locker, name: &str, o: &LockOptions) -> (Lease, Duration) {
    let (acquired, took) = timed(locker.acquire(name, o)).await;
    (acquired.unwrap(), took)
}

/// What `task` returned, awaited for at most `limit`; panics with `what` after that.
pub async fn within<T>(limit: Duration, task: JoinHandle<T>, what: &str) -> T {
    tokio::time::timeout(limit, task)
        .await
        .unwrap_or_else(|_| panic!("not within {limit:?}: {what}"))
        .unwrap()
}

/// Runs `fut`; returns its output and how long it took.
pub async fn timed<F: Future>(fut: F) -> (F::Output, Duration) {
    let start = Instant::now();
    let out = fut.await;
    (out, start.elapsed())
}

/// The reason of a `Lost` error in `res`; `None` for any other outcome.
pub fn lost_reason<T>(res: &Result<T, LockError>) -> Option<LostReason> {
    match res {
        Err(LockError::Lost { reason, .. }) => Some(*reason),
        _ => None,
    }
}

/// Asserts that the text of `err` contains each of `parts`.
pub fn assert_mentions(err: &impl Display, parts: &[&str]) {
    let text = err.to_string();
    for part in parts {
        assert!(text.contains(part), "`{part}` is not in: {text}");
    }
}

/// Asserts that `fences` strictly increase; `what` says which fences they are.
pub fn assert_increasing(fences: &[u64], what: &str) {
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "{what} must strictly increase: {fences:?}"
    );
}

/// Taken by the tests that must not overlap (they time real events, start a Cluster each, or
/// capture logs): it orders the tests of one binary, which share one process.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// xorshift64*: small, seedable, good enough to pick faults and operations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next(&mut self) -> u64 {
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
    let until = Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            Instant::now() < until,
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
