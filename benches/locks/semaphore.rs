//! Row 8: semaphore hand-off, 8 tasks on one shared `Locker` sharing 3 permits (row 3's
//! workload: hold 1 ms, 1 ms outside), against an ideal FIFO of 3 slots running the same workload
//! in the same run: a `tokio::sync::Semaphore` in this process (fair, first come first served,
//! and a hand-over that costs no round trip). What the engine loses to it is what taking and
//! freeing a permit over Redis costs.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockOptions, Locker};
use lock_testing::RedisServer;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::Config;
use crate::handoff::{Contender, EngineWorker, HANDOFF_TTL_MS, Pause, WORKERS, run_slots};
use crate::handoff_stats::Handoff;
use crate::raw::raw_connection;
use crate::report::{Report, median, ms, percentile, us, verdict};

const PERMITS: u32 = 3;
const NAME: &str = "bench:semaphore";
/// Rounds of one engine run and one ideal run, alternating.
const ROUNDS: usize = 3;

/// A worker of the ideal FIFO: the in-process semaphore all workers share.
struct IdealWorker(Arc<Semaphore>);

impl Contender for IdealWorker {
    type Held = OwnedSemaphorePermit;

    async fn take(&mut self) -> OwnedSemaphorePermit {
        Arc::clone(&self.0).acquire_owned().await.expect("open")
    }

    async fn give(&mut self, permit: OwnedSemaphorePermit) {
        drop(permit);
    }
}

async fn ideal_run(length: Duration) -> Handoff {
    let slots = Arc::new(Semaphore::new(PERMITS as usize));
    let workers = (0..WORKERS)
        .map(|_| IdealWorker(Arc::clone(&slots)))
        .collect();
    run_slots(workers, length, Pause::Precise, PERMITS).await
}

async fn engine_run(url: &str, length: Duration) -> Handoff {
    let opts = LockOptions::new(Duration::from_millis(HANDOFF_TTL_MS))
        .with_permits(PERMITS)
        .with_wait(Duration::from_secs(60));
    let locker = Locker::connect(url).await.expect("locker connects");
    // Warm-up: the scripts loaded, the subscription made.
    let lease = locker.acquire(NAME, &opts).await.expect("warm-up");
    lease.release().await.expect("warm-up");
    let workers = (0..WORKERS)
        .map(|_| EngineWorker {
            locker: locker.clone(),
            name: NAME,
            opts,
        })
        .collect();
    run_slots(workers, length, Pause::Precise, PERMITS).await
}

/// The time a permit stands free between one holder and the next: with every slot wanted, a
/// slot's cycle is a hold and a hand-over, so `utilisation = hold / (hold + gap)`.
fn gap(run: &Handoff) -> Duration {
    run.mean_hold.mul_f64(1.0 / run.utilisation.max(1e-9) - 1.0)
}

/// The p50 of 1,000 `PING`s, one after the other, on a connection of its own: one round trip
/// to the server on this machine now.
async fn ping_p50(url: &str) -> Duration {
    let mut conn = raw_connection(url).await;
    let mut times = Vec::with_capacity(1_000);
    for _ in 0..1_000 {
        let t = tokio::time::Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        times.push(t.elapsed());
    }
    times.sort();
    percentile(&times, 50.0)
}

/// "utilisation / wait p99".
fn figures(run: &Handoff) -> String {
    format!("{:.3} / {}", run.utilisation, ms(run.wait(99.0)))
}

/// One run's details for the note.
fn details(run: &Handoff) -> String {
    format!(
        "per worker {:?}, wait p50/p99/max {}, longest waiter served {:.0}%, mean hold {}, \
         machine stall {}, entries past {PERMITS} inside {}",
        run.counts,
        run.waits_text(),
        run.oldest_share * 100.0,
        ms(run.mean_hold),
        ms(run.stall),
        run.overlaps
    )
}

pub(crate) async fn semaphore(cfg: &Config, report: &mut Report) {
    let length = cfg.handoff_run;
    eprintln!(
        "row 8: semaphore hand-off ({WORKERS} workers, {PERMITS} permits, {ROUNDS} rounds of {length:?})"
    );
    let server = RedisServer::start();
    let (mut engine, mut ideal, mut pings) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        engine.push(engine_run(&server.url(), length).await);
        pings.push(ping_p50(&server.url()).await.as_secs_f64());
        ideal.push(ideal_run(length).await);
    }
    let gaps = |runs: &[Handoff]| median(runs.iter().map(|r| gap(r).as_secs_f64()).collect());
    let ping = median(pings);
    let ratio = |f: &dyn Fn(&Handoff) -> f64| {
        median(
            engine
                .iter()
                .zip(&ideal)
                .map(|(e, i)| f(e) / f(i))
                .collect(),
        )
    };
    let util = ratio(&|r| r.utilisation);
    let p99 = ratio(&|r| r.wait(99.0).as_secs_f64());
    let mid = |runs: &[Handoff]| {
        let utils = median(runs.iter().map(|r| r.utilisation).collect());
        let p99s = median(runs.iter().map(|r| r.wait(99.0).as_secs_f64()).collect());
        format!("{utils:.3} / {}", ms(Duration::from_secs_f64(p99s)))
    };
    report.row(
        "8",
        &format!(
            "semaphore hand-off, {WORKERS} tasks on one shared Locker, {PERMITS} permits (hold \
             1 ms, 1 ms outside), median of {ROUNDS} runs: utilisation of the {PERMITS} slots / \
             wait p99"
        ),
        mid(&engine),
        format!(
            "{} (ideal FIFO of {PERMITS} slots, in process)",
            mid(&ideal)
        ),
        format!("{util:.2} (util.) / {p99:.2} (p99)"),
        &format!("never more than {PERMITS} inside"),
        verdict(engine.iter().all(|r| r.overlaps == 0)),
    );
    let runs: Vec<String> = engine
        .iter()
        .zip(&ideal)
        .enumerate()
        .map(|(k, (e, i))| {
            format!(
                "round {}: engine {} ({}); ideal {} ({})",
                k + 1,
                figures(e),
                details(e),
                figures(i),
                details(i)
            )
        })
        .collect();
    report.note(format!(
        "8: what bounds it: a permit stands free {} between holders (the ideal: {}), {:.2} \
         round trips of {} (a PING's p50, measured after each engine run): the release's \
         request, its script, the grant's message and the waiter's wake-up",
        us(Duration::from_secs_f64(gaps(&engine))),
        us(Duration::from_secs_f64(gaps(&ideal))),
        gaps(&engine) / ping,
        us(Duration::from_secs_f64(ping)),
    ));
    report.note(format!(
        "8: utilisation = time held by any of the {PERMITS} holders / ({PERMITS} x the run); the \
         ideal is a tokio Semaphore (FIFO) in this process with the same workers and sleeps, \
         run right after each engine run; ratios are medians of the per-round ratios (engine / \
         ideal). {}",
        runs.join("; ")
    ));
}
