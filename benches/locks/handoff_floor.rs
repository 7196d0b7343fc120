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
use tokio::time::Instant;

use crate::handoff::{HANDOFF_TTL_MS, HOLD, OUTSIDE, Pause, WORKERS, collect, window};
use crate::handoff_stats::{Handoff, Queue, Section, WorkerOut};
use crate::raw::{load_script, raw_connection};
use crate::stall_probe::StallProbe;

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
    handed: Arc<Notify>,
    subscription: MultiplexedConnection,
}

async fn worker(url: &str, w: usize) -> Worker {
    let handed = Arc::new(Notify::new());
    let wake = Arc::clone(&handed);
    let config = redis::AsyncConnectionConfig::new().set_push_sender(move |p: redis::PushInfo| {
        if p.kind == redis::PushKind::Message {
            // A permit if the waiter is not waiting yet: the message may beat its `notified`.
            wake.notify_one();
        }
        Ok::<(), std::convert::Infallible>(())
    });
    let mut subscription = redis::Client::open(format!("{url}?protocol=resp3"))
        .expect("url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("RESP3 connection");
    subscription
        .subscribe(format!("{KEY}:{w}"))
        .await
        .expect("SUBSCRIBE");
    Worker {
        conn: raw_connection(url).await,
        handed,
        subscription,
    }
}

async fn call(conn: &mut MultiplexedConnection, sha: &str, token: &str) -> i64 {
    redis::cmd("EVALSHA")
        .arg(sha)
        .arg(2)
        .arg(KEY)
        .arg(LIST)
        .arg(token)
        .arg(HANDOFF_TTL_MS)
        .query_async(conn)
        .await
        .expect("EVALSHA")
}

/// A run of row 3's workload (8 workers, hold 1 ms, 1 ms outside) on the raw FIFO hand-off.
pub(crate) async fn floor_handoff(url: &str, length: Duration, pause: Pause) -> Handoff {
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        workers.push(worker(url, w).await);
    }
    let take = load_script(&mut workers[0].conn, TAKE_OR_JOIN).await;
    let hand_over = load_script(&mut workers[0].conn, HAND_OVER).await;
    let section = Section::default();
    let queue = Queue::new(WORKERS);
    let probe = StallProbe::start();
    let (start, end) = window(length);
    let handles: Vec<_> = workers
        .into_iter()
        .enumerate()
        .map(|(w, worker)| {
            let (section, queue) = (section.clone(), queue.clone());
            let (take, hand_over) = (take.clone(), hand_over.clone());
            tokio::spawn(async move {
                // Moved in whole: an async block captures only the fields it names, and the
                // subscription must live as long as the worker.
                let Worker {
                    mut conn,
                    handed,
                    subscription,
                } = worker;
                let token = w.to_string();
                let mut out = WorkerOut::default();
                tokio::time::sleep_until(start).await;
                while Instant::now() < end {
                    let t0 = Instant::now();
                    queue.start_waiting(w, t0);
                    if call(&mut conn, &take, &token).await == 0 {
                        tokio::time::timeout(Duration::from_secs(10), handed.notified())
                            .await
                            .expect("raw hand-off: no message handed the lock over in 10 s");
                    }
                    let t1 = Instant::now();
                    out.oldest_won += u64::from(queue.served(w, t0));
                    section.enter();
                    pause.sleep(HOLD).await;
                    section.leave();
                    let t2 = Instant::now();
                    let released = call(&mut conn, &hand_over, &token).await;
                    assert!(released > 0, "raw hand-off: the lock was not ours");
                    out.record((start, end), t0, t1, t2);
                    pause.sleep(OUTSIDE).await;
                }
                drop(subscription);
                out
            })
        })
        .collect();
    collect(handles, end - start, &section, probe).await
}
