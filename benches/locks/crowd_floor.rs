//! Row 9b's floor: the same 1,000 waiters on the raw FIFO hand-off of row 3d (a list, and a
//! message to the next waiter on a channel of its own), through one command connection and one
//! subscribing connection for all of them, as the engine's one `Locker` has.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_testing::RedisServer;
use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::handoff_floor::{FloorScripts, wake_connection};
use crate::raw::raw_connection;

const KEY: &str = "bench:queue-floor";
const LIST: &str = "bench:queue-floor:waiters";
const TTL_MS: u64 = 60_000;
const HOLDER: &str = "holder";

/// What the floor's queue gave: the gaps between one holder having the lock and the next (the
/// first from the holder's release), sorted; how many were served right after the waiter that
/// queued before them; the server memory each queued waiter took.
pub(crate) struct FloorQueue {
    pub(crate) gaps: Vec<Duration>,
    pub(crate) in_order: usize,
    pub(crate) bytes_per_waiter: u64,
}

/// The floor's scripts and its command connection, shared by every waiter.
#[derive(Clone)]
struct Raw {
    conn: MultiplexedConnection,
    scripts: FloorScripts,
}

impl Raw {
    async fn call(&self, hand_over: bool, token: &str) -> i64 {
        let mut conn = self.conn.clone();
        self.scripts
            .call(&mut conn, hand_over, (KEY, LIST), token, TTL_MS)
            .await
    }
}

/// `waiters` queue one after the other behind a holder; the holder releases, and each waiter
/// releases as soon as the lock is handed to it.
pub(crate) async fn floor_queue(server: &RedisServer, waiters: usize) -> FloorQueue {
    let url = server.url();
    let mut conn = raw_connection(&url).await;
    let raw = Raw {
        scripts: FloorScripts::load(&mut conn).await,
        conn: conn.clone(),
    };
    assert_eq!(
        raw.call(false, HOLDER).await,
        1,
        "the floor's holder takes the key"
    );
    // The waiters' channels count, as the engine's do.
    let memory_before = crate::raw::info_field(&mut conn, "memory", "used_memory").await;
    let wakes: Arc<Vec<Notify>> = Arc::new((0..waiters).map(|_| Notify::new()).collect());
    let _subscription = wake_connection(&url, KEY, &wakes, 0).await;
    let served = Arc::new(Mutex::new(Vec::with_capacity(waiters)));
    let mut tasks = Vec::with_capacity(waiters);
    for w in 0..waiters {
        // Queued in the order of their numbers: each joins before the next is sent.
        assert_eq!(
            raw.call(false, &w.to_string()).await,
            0,
            "waiter {w} queues"
        );
        let (raw, wakes, served) = (raw.clone(), Arc::clone(&wakes), Arc::clone(&served));
        tasks.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(30), wakes[w].notified())
                .await
                .expect("the floor hands the lock over within 30 s");
            served.lock().expect("order").push((w, Instant::now()));
            assert!(
                raw.call(true, &w.to_string()).await > 0,
                "the floor's lock is ours"
            );
        }));
    }
    let memory = crate::raw::info_field(&mut conn, "memory", "used_memory").await;
    let released = Instant::now();
    assert!(
        raw.call(true, HOLDER).await > 0,
        "the floor's holder releases"
    );
    for task in tasks {
        task.await.expect("floor waiter");
    }
    let served = served.lock().expect("order").clone();
    let (gaps, in_order) = crate::crowds::gaps_and_order(released, &served);
    FloorQueue {
        gaps,
        in_order,
        bytes_per_waiter: memory.saturating_sub(memory_before) / waiters as u64,
    }
}
