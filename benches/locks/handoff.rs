//! One hand-off run: 8 workers take one name in turn (hold 1 ms, 1 ms outside), through the
//! engine or through a 100 ms polling loop

use std::time::Duration;

use lock_runtime::{LockOptions, Locker, LockerBuilder};
use tokio::time::Instant;

use crate::handoff_stats::{Handoff, Queue, Section, WorkerOut};
use crate::raw::{RELEASE_LUA, load_script, raw_connection, raw_release, raw_take};
use crate::stall_probe::StallProbe;

pub(crate) const WORKERS: usize = 8;
pub(crate) const HOLD: Duration = Duration::from_millis(1);
pub(crate) const OUTSIDE: Duration = Duration::from_millis(1);
pub(crate) const HANDOFF_TTL_MS: u64 = 5_000;
const HANDOFF_NAME: &str = "bench:handoff";
const POLL_EVERY: Duration = Duration::from_millis(100);

/// How workers spend their 1 ms inside and outside the lock.
#[derive(Clone, Copy)]
pub(crate) enum Pause {
    /// `std::thread::sleep` on the blocking pool: about 1.1 ms, at no particular phase.
    Precise,
    /// `tokio::time::sleep`: the timer wheel rounds 1 ms up to the next millisecond tick (1-2 ms)
    /// and every worker of the runtime wakes on the same tick, so arrivals line up with releases.
    TokioTimer,
}

impl Pause {
    pub(crate) async fn sleep(self, d: Duration) {
        match self {
            Pause::Precise => tokio::task::spawn_blocking(move || std::thread::sleep(d))
                .await
                .expect("sleep"),
            Pause::TokioTimer => tokio::time::sleep(d).await,
        }
    }
}

/// How the workers share lockers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// 8 tasks of one service: one `Locker` (one connection, one subscription) for all.
    SharedLocker,
    /// 8 processes: a `Locker` each.
    SeparateLockers,
}

impl Shape {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Shape::SharedLocker => "8 tasks on one shared Locker",
            Shape::SeparateLockers => "8 tasks on 8 separate Lockers",
        }
    }
}

/// The run's window: workers start together, 20 ms from now, and stop asking at its end.
pub(crate) fn window(length: Duration) -> (Instant, Instant) {
    let start = Instant::now() + Duration::from_millis(20);
    (start, start + length)
}

/// The run's figures once every worker is done, with the probe's longest stall beside them.
pub(crate) async fn collect(
    handles: Vec<tokio::task::JoinHandle<WorkerOut>>,
    length: Duration,
    section: &Section,
    probe: StallProbe,
) -> Handoff {
    let mut outs = Vec::new();
    for h in handles {
        outs.push(h.await.expect("worker"));
    }
    Handoff::from(outs, length, section.overlaps(), probe.stop())
}

pub(crate) async fn engine_handoff(
    url: &str,
    length: Duration,
    pause: Pause,
    shape: Shape,
) -> Handoff {
    engine_handoff_on(&Locker::builder().url(url), length, pause, shape).await
}

/// The same on any deployment (row 7 runs it on a Redis Cluster).
pub(crate) async fn engine_handoff_on(
    builder: &LockerBuilder,
    length: Duration,
    pause: Pause,
    shape: Shape,
) -> Handoff {
    let opts =
        LockOptions::new(Duration::from_millis(HANDOFF_TTL_MS)).with_wait(Duration::from_secs(60));
    let mut lockers = Vec::new();
    for w in 0..WORKERS {
        if shape == Shape::SeparateLockers || w == 0 {
            lockers.push(builder.clone().connect().await.expect("locker connects"));
        } else {
            lockers.push(lockers[0].clone());
        }
    }
    // Warm-up: each worker takes and releases once, and the pub/sub connections get made.
    for locker in &lockers {
        let lease = locker.acquire(HANDOFF_NAME, &opts).await.expect("warm-up");
        lease.release().await.expect("warm-up");
    }
    let section = Section::default();
    let queue = Queue::new(WORKERS);
    let probe = StallProbe::start();
    let (start, end) = window(length);
    let handles: Vec<_> = lockers
        .into_iter()
        .enumerate()
        .map(|(w, locker)| {
            let (section, queue) = (section.clone(), queue.clone());
            tokio::spawn(async move {
                let mut out = WorkerOut::default();
                tokio::time::sleep_until(start).await;
                while Instant::now() < end {
                    let t0 = Instant::now();
                    queue.start_waiting(w, t0);
                    let lease = locker
                        .acquire(HANDOFF_NAME, &opts)
                        .await
                        .expect("acquires within wait");
                    let t1 = Instant::now();
                    out.oldest_won += u64::from(queue.served(w, t0));
                    section.enter();
                    pause.sleep(HOLD).await;
                    section.leave();
                    let t2 = Instant::now();
                    lease.release().await.expect("release");
                    out.record((start, end), t0, t1, t2);
                    pause.sleep(OUTSIDE).await;
                }
                out
            })
        })
        .collect();
    collect(handles, end - start, &section, probe).await
}

/// The textbook loop: try SET NX PX, sleep 100 ms on failure; release by compare-and-delete.
pub(crate) async fn polling_handoff(url: &str, length: Duration, pause: Pause) -> Handoff {
    let mut conns = Vec::new();
    for _ in 0..WORKERS {
        conns.push(raw_connection(url).await);
    }
    let sha = load_script(&mut conns[0], RELEASE_LUA).await;
    let section = Section::default();
    let queue = Queue::new(WORKERS);
    let probe = StallProbe::start();
    let (start, end) = window(length);
    let handles: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(w, mut conn)| {
            let (section, queue, sha) = (section.clone(), queue.clone(), sha.clone());
            tokio::spawn(async move {
                let key = format!("lock:{{{HANDOFF_NAME}}}:polling");
                let mut out = WorkerOut::default();
                tokio::time::sleep_until(start).await;
                while Instant::now() < end {
                    let token = format!("{w}-{}", out.count());
                    let t0 = Instant::now();
                    queue.start_waiting(w, t0);
                    while !raw_take(&mut conn, &key, &token, HANDOFF_TTL_MS).await {
                        tokio::time::sleep(POLL_EVERY).await;
                    }
                    let t1 = Instant::now();
                    out.oldest_won += u64::from(queue.served(w, t0));
                    section.enter();
                    pause.sleep(HOLD).await;
                    section.leave();
                    let t2 = Instant::now();
                    assert!(
                        raw_release(&mut conn, &sha, &key, &token).await,
                        "polling: not ours"
                    );
                    out.record((start, end), t0, t1, t2);
                    pause.sleep(OUTSIDE).await;
                }
                out
            })
        })
        .collect();
    collect(handles, end - start, &section, probe).await
}
