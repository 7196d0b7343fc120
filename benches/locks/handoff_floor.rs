//! Row 3d: the least a fair hand-off can cost here, a FIFO list and a message to the next waiter
//!
//! Each worker has a connection for its commands and a RESP3 connection subscribed to a channel
//! of its own, as the engine's waiters on 8 Lockers do. A busy attempt joins a list; a release
//! pops the first waiter, sets the key to its token and publishes on its channel, and the waiter
//! holds the lock once the message arrives. Nothing else: no eviction of a waiter that vanished
//! (it would hold the lock up forever), no fences, no bounds, no renewal. The gap between its
//! hand-overs and the engine's is what those cost.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;

use crate::handoff::{Contender, HANDOFF_TTL_MS, Pause, WORKERS, run};
use crate::handoff_stats::Handoff;
use crate::raw::{load_script, raw_connection};

const KEY: &str = "bench:handoff-floor";
const LIST: &str = "bench:handoff-floor:waiters";
/// Takes the lock, or joins the list and returns 0.
const TAKE_OR_JOIN: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
     return 1 end redis.call('RPUSH', KEYS[2], ARGV[1]) return 0";
/// Hands the lock to the first waiter (2) or deletes it (1); -1 when it was not ours.
const HAND_OVER: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end \
     local next = redis.call('LPOP', KEYS[2]) \
     if next then redis.call('SET', KEYS[1], next, 'PX', ARGV[2]) \
     redis.call('PUBLISH', KEYS[1] .. ':' .. next, '1') return 2 end \
     redis.call('DEL', KEYS[1]) return 1";

/// One worker's connections: commands, and the subscription that wakes it when handed the lock.
struct Worker {
    conn: MultiplexedConnection,
    /// Its one wake-up, notified by a message on its channel.
    handed: Arc<Vec<Notify>>,
    /// Kept for the worker's life: dropped, it would take the subscription with it.
    _subscription: MultiplexedConnection,
    token: String,
    scripts: FloorScripts,
}

async fn worker(url: &str, w: usize, scripts: &FloorScripts) -> Worker {
    let handed = Arc::new(vec![Notify::new()]);
    let subscription = wake_connection(url, KEY, &handed, w).await;
    Worker {
        conn: raw_connection(url).await,
        handed,
        _subscription: subscription,
        token: w.to_string(),
        scripts: scripts.clone(),
    }
}

impl Worker {
    async fn call(&mut self, hand_over: bool) -> i64 {
        let (scripts, token) = (&self.scripts, &self.token);
        scripts
            .call(
                &mut self.conn,
                hand_over,
                (KEY, LIST),
                token,
                HANDOFF_TTL_MS,
            )
            .await
    }
}

/// A RESP3 connection subscribed to `key:<n>` for `n` from `first` on, one per entry of `wakes`:
/// a message on `key:<n>` notifies `wakes[n - first]` (a permit if nobody waits on it yet, as
/// the message may beat its `notified`).
pub(crate) async fn wake_connection(
    url: &str,
    key: &str,
    wakes: &Arc<Vec<Notify>>,
    first: usize,
) -> MultiplexedConnection {
    let routes = Arc::clone(wakes);
    let config = redis::AsyncConnectionConfig::new().set_push_sender(move |p: redis::PushInfo| {
        if p.kind == redis::PushKind::Message
            && let Some(redis::Value::BulkString(channel)) = p.data.first()
            && let Some(n) = std::str::from_utf8(channel)
                .ok()
                .and_then(|c| c.rsplit(':').next())
                .and_then(|n| n.parse::<usize>().ok())
            && let Some(wake) = n.checked_sub(first).and_then(|i| routes.get(i))
        {
            wake.notify_one();
        }
        Ok::<(), std::convert::Infallible>(())
    });
    let mut subscription = redis::Client::open(format!("{url}?protocol=resp3"))
        .expect("url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("RESP3 connection");
    for n in first..first + wakes.len() {
        subscription
            .subscribe(format!("{key}:{n}"))
            .await
            .expect("SUBSCRIBE");
    }
    subscription
}

/// The floor's two scripts, loaded: `TAKE_OR_JOIN` and `HAND_OVER`.
#[derive(Clone)]
pub(crate) struct FloorScripts {
    take: String,
    hand_over: String,
}

impl FloorScripts {
    pub(crate) async fn load(conn: &mut MultiplexedConnection) -> Self {
        Self {
            take: load_script(conn, TAKE_OR_JOIN).await,
            hand_over: load_script(conn, HAND_OVER).await,
        }
    }

    /// One call of `HAND_OVER` (or, not `hand_over`, `TAKE_OR_JOIN`) on the lock `key` and its
    /// waiters' `list`, for `token`.
    pub(crate) async fn call(
        &self,
        conn: &mut MultiplexedConnection,
        hand_over: bool,
        (key, list): (&str, &str),
        token: &str,
        ttl_ms: u64,
    ) -> i64 {
        let sha = if hand_over {
            &self.hand_over
        } else {
            &self.take
        };
        redis::cmd("EVALSHA")
            .arg(sha)
            .arg(2)
            .arg(key)
            .arg(list)
            .arg(token)
            .arg(ttl_ms)
            .query_async(conn)
            .await
            .expect("EVALSHA")
    }
}

impl Contender for Worker {
    type Held = ();

    async fn take(&mut self) {
        if self.call(false).await == 0 {
            tokio::time::timeout(Duration::from_secs(10), self.handed[0].notified())
                .await
                .expect("raw hand-off: no message handed the lock over in 10 s");
        }
    }

    async fn give(&mut self, (): ()) {
        let released = self.call(true).await;
        assert!(released > 0, "raw hand-off: the lock was not ours");
    }
}

/// A run of row 3's workload (8 workers, hold 1 ms, 1 ms outside) on the raw FIFO hand-off.
pub(crate) async fn floor_handoff(url: &str, length: Duration, pause: Pause) -> Handoff {
    let scripts = FloorScripts::load(&mut raw_connection(url).await).await;
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        workers.push(worker(url, w, &scripts).await);
    }
    run(workers, length, pause).await
}
