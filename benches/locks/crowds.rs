//! Row 9: thousands at once on one server. 9a: 10,000 distinct names, each held, each with one
//! waiter on another `Locker`; all released at once: the wake-up latency, the server's CPU per
//! wake-up, and the subscriptions and connections the waiting `Locker` opened. 9b: 1,000
//! waiters queued on one name, each releasing as soon as it has it: the order they are served
//! in against the order they queued, the hand-over latency, and the server memory per waiter.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockOptions, Locker};
use lock_testing::RedisServer;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::raw::raw_connection;
use crate::report::{Report, Verdict, ms, percentile};
use crate::threads::ThreadClock;

const NAMES: usize = 10_000;
const WAITERS: usize = 1_000;

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(60)).with_wait(Duration::from_secs(120))
}

/// A locker on `server` whose requests may wait 30 s for their reply: 10,000 releases at once
/// queue up behind one another on the one server.
async fn patient(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .response_timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connects")
}

/// Waits (bounded) until `n` keys match `pattern`.
async fn keys_reach(conn: &mut MultiplexedConnection, pattern: &str, n: usize) {
    for _ in 0..6_000 {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(conn)
            .await
            .expect("KEYS");
        if keys.len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("fewer than {n} keys match {pattern}");
}

pub(crate) async fn crowds(report: &mut Report) {
    eprintln!("row 9: thousands of names and waiters on one server");
    many_names(report).await;
    one_name(report).await;
}

/// Row 9a.
async fn many_names(report: &mut Report) {
    let server = RedisServer::start();
    let mut raw = raw_connection(&server.url()).await;
    let holders = patient(&server).await;
    let waiters = patient(&server).await;
    let name = |i: usize| format!("bench:crowd:{i}");
    let mut leases = Vec::with_capacity(NAMES);
    for i in 0..NAMES {
        leases.push(holders.acquire(&name(i), &opts()).await.expect("held"));
    }
    let tasks: Vec<_> = (0..NAMES)
        .map(|i| {
            let (waiters, name) = (waiters.clone(), name(i));
            tokio::spawn(async move {
                let lease = waiters.acquire(&name, &opts()).await.expect("served");
                let at = Instant::now();
                drop(lease);
                at
            })
        })
        .collect();
    keys_reach(&mut raw, "*:waiters", NAMES).await;
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(&mut raw)
        .await
        .expect("PUBSUB");
    let clients = crate::raw::info_field(&mut raw, "clients", "connected_clients").await;
    // What the waiting alone costs the server: the waiters come back to keep their places.
    crate::raw::reset_stats(&mut raw).await;
    let idle_cpu = ThreadClock::start(&server.pid().to_string(), None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting_calls = crate::raw::calls_of(&mut raw, "evalsha").await;
    let waiting_cpu = idle_cpu.elapsed().0 as f64 / 1e9;
    let cpu = ThreadClock::start(&server.pid().to_string(), None);
    // Each release on a task of its own: the release phase is the engine's, not a join's.
    let releases: Vec<_> = leases
        .into_iter()
        .map(|lease| {
            let t = Instant::now();
            (t, tokio::spawn(lease.release()))
        })
        .collect();
    let mut released = Vec::with_capacity(NAMES);
    for (t, release) in releases {
        release.await.expect("release task").expect("release");
        released.push(t);
    }
    let mut wakes = Vec::with_capacity(NAMES);
    for (task, sent) in tasks.into_iter().zip(&released) {
        let served = task.await.expect("waiter");
        wakes.push(served.saturating_duration_since(*sent));
    }
    let cpu_us = cpu.elapsed().0 as f64 / 1e3 / NAMES as f64;
    wakes.sort();
    report.row(
        "9a",
        "10,000 names, each held and with one waiter (another Locker), all released at once: wake-up p50 / p99",
        format!("{} / {}", ms(percentile(&wakes, 50.0)), ms(percentile(&wakes, 99.0))),
        format!("{cpu_us:.0} µs of server CPU per wake-up"),
        "-".to_owned(),
        "report",
        Verdict::Info,
    );
    report.note(format!(
        "9a: while the 10,000 waiters waited, the server had {} channels subscribed and {} \
         client connections in all (two Lockers: each has its command connection and one \
         subscribing connection, whatever the number of names), and ran {} script calls a \
         second ({:.0}% of a CPU) for the waiters coming back to keep their places; wake-up: \
         from release() being called to the waiter's acquire() returning, max {}; the server's \
         CPU over the release phase (the releases, the grants and the waiters' returns) per \
         wake-up",
        channels.len(),
        clients,
        waiting_calls,
        waiting_cpu * 100.0,
        ms(*wakes.last().unwrap_or(&Duration::ZERO)),
    ));
}

/// Row 9b.
async fn one_name(report: &mut Report) {
    let server = RedisServer::start();
    let mut raw = raw_connection(&server.url()).await;
    let locker = patient(&server).await;
    let holder = locker.acquire("bench:queue", &opts()).await.expect("held");
    let memory_before = crate::raw::info_field(&mut raw, "memory", "used_memory").await;
    let served = Arc::new(Mutex::new(Vec::with_capacity(WAITERS)));
    let mut tasks = Vec::with_capacity(WAITERS);
    for w in 0..WAITERS {
        let (locker, served) = (locker.clone(), Arc::clone(&served));
        tasks.push(tokio::spawn(async move {
            let lease = locker
                .acquire("bench:queue", &opts())
                .await
                .expect("served");
            served.lock().expect("order").push((w, Instant::now()));
            lease.release().await.expect("release");
        }));
        // Arrival order: the next waiter comes once this one has its place.
        wait_queued(&mut raw, w + 1).await;
    }
    let queued: Vec<String> = redis::cmd("ZRANGE")
        .arg("lock:{bench:queue}:waiters")
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .expect("queue");
    let memory = crate::raw::info_field(&mut raw, "memory", "used_memory").await;
    let per_waiter = memory.saturating_sub(memory_before) / WAITERS as u64;
    let released = Instant::now();
    holder.release().await.expect("release");
    for task in tasks {
        task.await.expect("waiter");
    }
    let served = served.lock().expect("order").clone();
    let (gaps, in_order) = gaps_and_order(released, &served);
    let floor = crate::crowd_floor::floor_queue(&RedisServer::start(), WAITERS).await;
    let p99 = |gaps: &[Duration]| percentile(gaps, 99.0);
    report.row(
        "9b",
        "1,000 waiters queued on one name, each releasing at once: hand-over p50 / p99; served in arrival order; server memory per queued waiter",
        format!(
            "{} / {}; {}/{} in order; {per_waiter} B",
            ms(percentile(&gaps, 50.0)),
            ms(p99(&gaps)),
            in_order,
            served.len()
        ),
        format!(
            "raw FIFO hand-off (3d's list and messages, one connection each for commands and messages): {} / {}; {}/{} in order; {} B",
            ms(percentile(&floor.gaps, 50.0)),
            ms(p99(&floor.gaps)),
            floor.in_order,
            floor.gaps.len(),
            floor.bytes_per_waiter
        ),
        format!(
            "{:.2} (hand-over p99)",
            p99(&gaps).as_secs_f64() / p99(&floor.gaps).as_secs_f64().max(1e-9)
        ),
        "report",
        Verdict::Info,
    );
    report.note(format!(
        "9b: {} waiters were in the queue when the holder released (each came once the one \
         before had its place); in order = served right after the waiter that queued before it; \
         hand-over: from one holder's acquire() returning (the first: the holder's release) to \
         the next one's",
        queued.len()
    ));
}

/// The gaps, sorted, between `released` and the first waiter having the lock and between each
/// waiter and the next (`served`: waiter number and when it had the lock, in the order served);
/// and how many were served in the order they queued (the first counts when it queued first).
pub(crate) fn gaps_and_order(
    released: Instant,
    served: &[(usize, Instant)],
) -> (Vec<Duration>, usize) {
    let first_in_order = served.first().is_some_and(|s| s.0 == 0);
    let in_order =
        served.windows(2).filter(|p| p[0].0 < p[1].0).count() + usize::from(first_in_order);
    let mut gaps: Vec<Duration> = std::iter::once(released)
        .chain(served.iter().map(|s| s.1))
        .collect::<Vec<_>>()
        .windows(2)
        .map(|p| p[1].saturating_duration_since(p[0]))
        .collect();
    gaps.sort();
    (gaps, in_order)
}

/// Waits (bounded) until `n` waiters are queued on `bench:queue`.
async fn wait_queued(raw: &mut MultiplexedConnection, n: usize) {
    for _ in 0..6_000 {
        let queued: usize = redis::cmd("ZCARD")
            .arg("lock:{bench:queue}:waiters")
            .query_async(raw)
            .await
            .expect("ZCARD");
        if queued >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("fewer than {n} waiters queued");
}
