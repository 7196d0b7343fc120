//! Row 3: contended hand-off

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::testing::RedisServer;
use lock_runtime::{LockOptions, Locker};
use tokio::time::Instant;

use crate::Config;
use crate::raw::{RELEASE_LUA, load_script, raw_connection, raw_release, raw_take};
use crate::report::{Report, Verdict, ms, percentile, verdict};

const WORKERS: usize = 8;
const HOLD: Duration = Duration::from_millis(1);
const OUTSIDE: Duration = Duration::from_millis(1);
const HANDOFF_TTL_MS: u64 = 5_000;
const HANDOFF_NAME: &str = "bench:handoff";
const POLL_EVERY: Duration = Duration::from_millis(100);

#[derive(Default)]
struct WorkerOut {
    count: u64,
    held: Duration,
    hold_total: Duration,
    waits: Vec<Duration>,
    /// Acquisitions that went to the worker that had waited longest (no older waiter left behind).
    oldest_won: u64,
}

/// When each worker started waiting (None: not waiting), to see who overtakes whom.
type Queue = Arc<Mutex<Vec<Option<Instant>>>>;

/// Marks worker `w` as waiting since `t0`.
fn start_waiting(queue: &Queue, w: usize, t0: Instant) {
    queue.lock().expect("queue")[w] = Some(t0);
}

/// Marks worker `w` as served; true when no worker that is still waiting started before it.
fn served(queue: &Queue, w: usize, t0: Instant) -> bool {
    let mut q = queue.lock().expect("queue");
    q[w] = None;
    !q.iter().flatten().any(|&t| t < t0)
}

impl WorkerOut {
    /// Records one acquisition: asked at `t0`, held from `t1` until `t2` (clipped to the run).
    fn record(&mut self, run: (Instant, Instant), t0: Instant, t1: Instant, t2: Instant) {
        let (start, end) = run;
        self.count += 1;
        self.waits.push(t1 - t0);
        self.hold_total += t2 - t1;
        let (from, to) = (t1.max(start), t2.min(end));
        if to > from {
            self.held += to - from;
        }
    }
}

struct Handoff {
    utilisation: f64,
    /// Share of acquisitions that went to the longest waiter (1.0 is FIFO).
    oldest_share: f64,
    waits: Vec<Duration>,
    counts: Vec<u64>,
    mean_hold: Duration,
    overlaps: u64,
}

impl Handoff {
    fn from(outs: Vec<WorkerOut>, wall: Duration, overlaps: u64) -> Self {
        let held: Duration = outs.iter().map(|o| o.held).sum();
        let hold_total: Duration = outs.iter().map(|o| o.hold_total).sum();
        let counts: Vec<u64> = outs.iter().map(|o| o.count).collect();
        let oldest: u64 = outs.iter().map(|o| o.oldest_won).sum();
        let mut waits: Vec<Duration> = outs.into_iter().flat_map(|o| o.waits).collect();
        waits.sort();
        let total: u64 = counts.iter().sum();
        Self {
            utilisation: held.as_secs_f64() / wall.as_secs_f64(),
            oldest_share: oldest as f64 / total.max(1) as f64,
            waits,
            counts,
            mean_hold: hold_total / total.max(1) as u32,
            overlaps,
        }
    }

    fn p(&self, p: f64) -> Duration {
        percentile(&self.waits, p)
    }

    fn waits_text(&self) -> String {
        format!(
            "{} / {} / {}",
            ms(self.p(50.0)),
            ms(self.p(99.0)),
            ms(self.waits.last().copied().unwrap_or_default())
        )
    }

    fn fair(&self) -> f64 {
        self.counts.iter().sum::<u64>() as f64 / self.counts.len() as f64
    }

    fn starved(&self) -> usize {
        let fair = self.fair();
        self.counts
            .iter()
            .filter(|&&c| (c as f64) < fair / 2.0)
            .count()
    }

    fn counts_text(&self) -> String {
        let min = self.counts.iter().min().copied().unwrap_or(0);
        let max = self.counts.iter().max().copied().unwrap_or(0);
        format!(
            "min {min} / fair {:.0} / max {max}, {} starved",
            self.fair(),
            self.starved()
        )
    }
}

/// How workers spend their 1 ms inside and outside the lock.
#[derive(Clone, Copy)]
enum Pause {
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

/// Marks the section as entered; counts a second holder inside at once.
fn enter(inside: &AtomicBool, overlaps: &AtomicU64) {
    if inside.swap(true, Ordering::SeqCst) {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
}

async fn engine_handoff(url: &str, secs: Duration, pause: Pause) -> Handoff {
    let opts =
        LockOptions::new(Duration::from_millis(HANDOFF_TTL_MS)).with_wait(Duration::from_secs(60));
    // One Locker per worker: the workers stand for separate processes.
    let mut lockers = Vec::new();
    for _ in 0..WORKERS {
        lockers.push(Locker::connect(url).await.expect("locker connects"));
    }
    // Warm-up: each worker takes and releases once, and the pub/sub connections get made.
    for locker in &lockers {
        locker
            .acquire(HANDOFF_NAME, &opts)
            .await
            .expect("warm-up")
            .release()
            .await
            .expect("warm-up");
    }
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let queue: Queue = Arc::new(Mutex::new(vec![None; WORKERS]));
    let start = Instant::now() + Duration::from_millis(20);
    let end = start + secs;
    let handles: Vec<_> = lockers
        .into_iter()
        .enumerate()
        .map(|(w, locker)| {
            let (inside, overlaps, queue) = (
                Arc::clone(&inside),
                Arc::clone(&overlaps),
                Arc::clone(&queue),
            );
            tokio::spawn(async move {
                let mut out = WorkerOut::default();
                tokio::time::sleep_until(start).await;
                while Instant::now() < end {
                    let t0 = Instant::now();
                    start_waiting(&queue, w, t0);
                    let lease = locker
                        .acquire(HANDOFF_NAME, &opts)
                        .await
                        .expect("acquires within wait");
                    let t1 = Instant::now();
                    out.oldest_won += u64::from(served(&queue, w, t0));
                    enter(&inside, &overlaps);
                    pause.sleep(HOLD).await;
                    inside.store(false, Ordering::SeqCst);
                    let t2 = Instant::now();
                    lease.release().await.expect("release");
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
    Handoff::from(outs, end - start, overlaps.load(Ordering::SeqCst))
}

/// The textbook loop: try SET NX PX, sleep 100 ms on failure; release by compare-and-delete.
async fn polling_handoff(url: &str, secs: Duration, pause: Pause) -> Handoff {
    let mut conns = Vec::new();
    for _ in 0..WORKERS {
        conns.push(raw_connection(url).await);
    }
    let sha = load_script(&mut conns[0], RELEASE_LUA).await;
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let queue: Queue = Arc::new(Mutex::new(vec![None; WORKERS]));
    let start = Instant::now() + Duration::from_millis(20);
    let end = start + secs;
    let handles: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(w, mut conn)| {
            let (inside, overlaps, queue, sha) = (
                Arc::clone(&inside),
                Arc::clone(&overlaps),
                Arc::clone(&queue),
                sha.clone(),
            );
            tokio::spawn(async move {
                let key = format!("lock:{{{HANDOFF_NAME}}}:polling");
                let mut out = WorkerOut::default();
                tokio::time::sleep_until(start).await;
                while Instant::now() < end {
                    let token = format!("{w}-{}", out.count);
                    let t0 = Instant::now();
                    start_waiting(&queue, w, t0);
                    while !raw_take(&mut conn, &key, &token, HANDOFF_TTL_MS).await {
                        tokio::time::sleep(POLL_EVERY).await;
                    }
                    let t1 = Instant::now();
                    out.oldest_won += u64::from(served(&queue, w, t0));
                    enter(&inside, &overlaps);
                    pause.sleep(HOLD).await;
                    inside.store(false, Ordering::SeqCst);
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
    let mut outs = Vec::new();
    for h in handles {
        outs.push(h.await.expect("worker"));
    }
    Handoff::from(outs, end - start, overlaps.load(Ordering::SeqCst))
}

pub(crate) async fn contended(cfg: &Config, report: &mut Report) {
    eprintln!(
        "row 3: contended hand-off ({WORKERS} workers, {:?} each)",
        cfg.secs
    );
    let server = RedisServer::start();
    let engine = engine_handoff(&server.url(), cfg.secs, Pause::Precise).await;
    let polling = polling_handoff(&server.url(), cfg.secs, Pause::Precise).await;
    let ticked = engine_handoff(&server.url(), cfg.secs, Pause::TokioTimer).await;

    report.row(
        "3a",
        "hand-off, 8 workers x (hold 1 ms, 1 ms outside): utilisation",
        format!("{:.3}", engine.utilisation),
        format!("{:.3} (100 ms polling loop)", polling.utilisation),
        format!("{:.2}", engine.utilisation / polling.utilisation),
        ">= 0.75",
        verdict(engine.utilisation >= 0.75),
    );
    let p99 = engine.p(99.0);
    report.row(
        "3b",
        "hand-off: wait p50 / p99 / max",
        engine.waits_text(),
        polling.waits_text(),
        format!(
            "{:.3} (p99)",
            p99.as_secs_f64() / polling.p(99.0).as_secs_f64()
        ),
        "p99 <= 25 ms",
        verdict(p99 <= Duration::from_millis(25)),
    );
    report.row(
        "3c",
        "hand-off: acquisitions per worker",
        engine.counts_text(),
        polling.counts_text(),
        "-".to_owned(),
        "each >= fair/2",
        verdict(engine.starved() == 0),
    );
    report.row(
        "3d",
        "hand-off as 3a-c, but tokio::time::sleep for the 1 ms: util., wait p50 / p99 / max",
        format!("{:.3}; {}", ticked.utilisation, ticked.waits_text()),
        "-".to_owned(),
        "-".to_owned(),
        "(diagnostic)",
        Verdict::Info,
    );
    report.note(format!(
        "3d: with tokio::time::sleep every worker sleeps 1-2 ms (mean hold {}) and wakes on the \
         same timer tick as the holder that releases, so a worker coming back from outside tends \
         to reach the server before the waiters woken by the release message (barging): longest \
         waiter served {:.0}% of the time; per-worker acquisitions {:?}",
        ms(ticked.mean_hold),
        ticked.oldest_share * 100.0,
        ticked.counts,
    ));
    report.note(format!(
        "3: per-worker acquisitions: engine {:?}, polling {:?}; acquisitions that went to the \
         longest waiter (FIFO = 100%, random among 7 waiters ~ 1/7): engine {:.0}%, polling {:.0}%; \
         mean time held per acquisition \
         (std::thread::sleep of 1 ms on the blocking pool) engine {}, polling {}; utilisation counts from acquire() returning \
         to release() being called; overlapping holders seen: engine {}, polling {}; lease ttl {} ms",
        engine.counts,
        polling.counts,
        engine.oldest_share * 100.0,
        polling.oldest_share * 100.0,
        ms(engine.mean_hold),
        ms(polling.mean_hold),
        engine.overlaps,
        polling.overlaps,
        HANDOFF_TTL_MS
    ));
}
