//! One hand-off run: 8 workers take one name in turn (hold 1 ms, 1 ms outside), through the
//! engine or through a 100 ms polling loop

use std::time::Duration;

use lock_runtime::{Lease, LockOptions, Locker, LockerBuilder};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::handoff_stats::{Handoff, Queue, Section, WorkerOut};
use crate::raw::{RELEASE_LUA, load_script, raw_connection, raw_release, raw_take};
use crate::stall_probe::StallProbe;

pub(crate) const WORKERS: usize = 8;
const HOLD: Duration = Duration::from_millis(1);
const OUTSIDE: Duration = Duration::from_millis(1);
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
    async fn sleep(self, d: Duration) {
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

/// The run's window: workers start together, 20 ms from now, and make no new request after its end.
fn window(length: Duration) -> (Instant, Instant) {
    let start = Instant::now() + Duration::from_millis(20);
    (start, start + length)
}

/// One worker's way of taking the lock and giving it back.
pub(crate) trait Contender: Send + 'static {
    /// What the worker holds while it has the lock.
    type Held: Send;
    fn take(&mut self) -> impl Future<Output = Self::Held> + Send;
    fn give(&mut self, held: Self::Held) -> impl Future<Output = ()> + Send;
}

/// Row 3's workload on `contenders`, one task each: take the lock, hold it 1 ms, give it back,
/// stay 1 ms outside, until the run's window ends; with the probe's longest stall beside it.
pub(crate) async fn run<C: Contender>(
    contenders: Vec<C>,
    length: Duration,
    pause: Pause,
) -> Handoff {
    run_slots(contenders, length, pause, 1).await
}

/// The same workload on a lock that lets `slots` holders in at once (row 8).
pub(crate) async fn run_slots<C: Contender>(
    contenders: Vec<C>,
    length: Duration,
    pause: Pause,
    slots: u32,
) -> Handoff {
    let section = Section::new(slots as usize);
    let queue = Queue::new(contenders.len());
    let probe = StallProbe::start();
    let (start, end) = window(length);
    let handles: Vec<_> = contenders
        .into_iter()
        .enumerate()
        .map(|(w, mut contender)| {
            let (section, queue) = (section.clone(), queue.clone());
            tokio::spawn(async move {
                let mut out = WorkerOut::default();
                tokio::time::sleep_until(start).await;
                while Instant::now() < end {
                    let t0 = Instant::now();
                    queue.start_waiting(w, t0);
                    let held = contender.take().await;
                    let t1 = Instant::now();
                    out.oldest_won += u64::from(queue.served(w, t0));
                    section.enter();
                    pause.sleep(HOLD).await;
                    section.leave();
                    let t2 = Instant::now();
                    contender.give(held).await;
                    out.record((start, end), t0, t1, t2);
                    pause.sleep(OUTSIDE).await;
                }
                out
            })
        })
        .collect();
    let mut outs = Vec::new();
    for h in handles {
        outs.push(h.await.expect("worker"));
    }
    Handoff::from(
        outs,
        (end - start, slots),
        section.overlaps(),
        probe.finish(),
    )
}

/// A worker of the engine: its `Locker` (its own, or one shared by all), the name and options
/// it takes.
pub(crate) struct EngineWorker {
    pub(crate) locker: Locker,
    pub(crate) name: &'static str,
    pub(crate) opts: LockOptions,
}

impl Contender for EngineWorker {
    type Held = Lease;

    async fn take(&mut self) -> Lease {
        self.locker
            .acquire(self.name, &self.opts)
            .await
            .expect("acquires within wait")
    }

    async fn give(&mut self, lease: Lease) {
        lease.release().await.expect("release");
    }
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
    let opts = handoff_opts();
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
    let workers = lockers
        .into_iter()
        .map(|locker| EngineWorker {
            locker,
            name: HANDOFF_NAME,
            opts,
        })
        .collect();
    run(workers, length, pause).await
}

/// Row 3's workload on the lock `name`, `WORKERS` tasks on one shared `Locker`, worker `w`
/// taking it with `opts_of(w)`: the other kinds of hold (a permit, shared and exclusive holds),
/// in `slots` places at once.
pub(crate) async fn engine_handoff_kinds(
    url: &str,
    length: Duration,
    (name, slots): (&'static str, u32),
    opts_of: fn(usize) -> LockOptions,
) -> Handoff {
    let locker = Locker::builder()
        .url(url)
        .connect()
        .await
        .expect("locker connects");
    let workers: Vec<EngineWorker> = (0..WORKERS)
        .map(|w| EngineWorker {
            locker: locker.clone(),
            name,
            opts: opts_of(w),
        })
        .collect();
    for worker in &workers {
        let lease = locker.acquire(name, &worker.opts).await.expect("warm-up");
        lease.release().await.expect("warm-up");
    }
    run_slots(workers, length, Pause::Precise, slots).await
}

/// The options of row 3's workers, for a lock of `HANDOFF_TTL_MS` that waits up to a minute.
pub(crate) fn handoff_opts() -> LockOptions {
    LockOptions::new(Duration::from_millis(HANDOFF_TTL_MS)).with_wait(Duration::from_secs(60))
}

/// A worker of the textbook loop: try SET NX PX, sleep 100 ms on failure; release by
/// compare-and-delete.
struct PollingWorker {
    conn: MultiplexedConnection,
    sha: String,
    w: usize,
    taken: u64,
}

const POLLING_KEY: &str = "lock:{bench:handoff}:polling";

impl Contender for PollingWorker {
    /// The token the key was taken with.
    type Held = String;

    async fn take(&mut self) -> String {
        self.taken += 1;
        let token = format!("{}-{}", self.w, self.taken);
        while !raw_take(&mut self.conn, POLLING_KEY, &token, HANDOFF_TTL_MS).await {
            tokio::time::sleep(POLL_EVERY).await;
        }
        token
    }

    async fn give(&mut self, token: String) {
        assert!(
            raw_release(&mut self.conn, &self.sha, POLLING_KEY, &token).await,
            "polling: not ours"
        );
    }
}

pub(crate) async fn polling_handoff(url: &str, length: Duration, pause: Pause) -> Handoff {
    // Scripts are the server's: loaded once, called on every connection.
    let sha = load_script(&mut raw_connection(url).await, RELEASE_LUA).await;
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        workers.push(PollingWorker {
            conn: raw_connection(url).await,
            sha: sha.clone(),
            w,
            taken: 0,
        });
    }
    run(workers, length, pause).await
}
