//! A scheduled job that must run once per tick across every process that schedules it.
//!
//! Run: `cargo xtask example` or `cargo run -p lock-examples --example scheduled_job` (uses
//! `REDIS_URL` when set, else a private redis-server; `RUST_LOG=debug` also shows the engine's
//! events).
//!
//! The job to copy is `send_report` below: `min_hold` is what makes it run once per tick.
//!
//! The example starts three copies of itself as worker processes, as three machines would run
//! the service. Each fires `send_report` at every whole second of its own clock, as a cron
//! schedule does (a scheduler crate such as tokio-cron-scheduler calls the same function). The
//! machines' clocks differ a little (here worker `i`'s runs 40 ms behind worker `i - 1`'s), and
//! the job takes 20 ms, so by the time a late worker fires, an early one may already have
//! finished:
//!
//! - without `min_hold`, the lock is free again when the early worker's 20 ms are over, and a
//!   late worker runs the same tick again;
//! - with `min_hold = "800ms"` (a little under the 1 s period), the first worker to fire keeps
//!   the lock for 800 ms, the others find it held and skip: one run per tick.
//!
//! The parent reads which worker ran each tick from their output and checks the second case.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{Locker, distributed_lock};
use lock_testing::redis_url_or_private_server;

const WORKERS: u32 = 3;
/// Ticks each round lets the workers run.
const TICKS: u64 = 4;
/// How far each worker's clock is behind the one before.
const SKEW: Duration = Duration::from_millis(40);

/// Sends the daily report; runs on one worker per tick, cluster-wide. A worker that finds the
/// lock held skips the tick (`()` return: the skip is logged at `debug`).
#[distributed_lock(name = "daily-report", ttl = "5s", min_hold = "800ms")]
async fn send_report(worker: u32, tick: u64) {
    report(worker, tick).await;
}

/// The same job without `min_hold`: the lock is free as soon as the 20 ms body ends.
#[distributed_lock(name = "daily-report-without-min-hold", ttl = "5s")]
async fn send_report_without_min_hold(worker: u32, tick: u64) {
    report(worker, tick).await;
}

/// The job's work; tells the parent which worker ran which tick.
async fn report(worker: u32, tick: u64) {
    println!("ran {tick} {worker}");
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// A worker process: fires the job at each of the [`TICKS`] whole seconds after `start`, by a
/// clock [`SKEW`] times its id behind the parent's.
async fn worker(id: u32, with_min_hold: bool, url: &str, start: SystemTime) {
    let locker = Locker::builder()
        .url(url)
        .label(format!("worker-{id}"))
        .connect()
        .await
        .expect("connect");
    lock_runtime::set_default_locker(locker).expect("first default locker");
    for tick in 1..=TICKS {
        // A tick is named by its second, as the worker's own clock shows it.
        let second = start + Duration::from_secs(tick);
        sleep_until(second + SKEW * id).await;
        let tick = unix_secs(second);
        if with_min_hold {
            send_report(id, tick).await;
        } else {
            send_report_without_min_hold(id, tick).await;
        }
    }
}

/// The parent: runs one round of [`WORKERS`] worker processes; returns the workers that ran
/// each tick, by tick.
fn round(url: &str, with_min_hold: bool) -> BTreeMap<u64, Vec<u32>> {
    // Early enough for every worker to be connected before the first tick, a second later.
    let start = unix_secs(SystemTime::now()) + 2;
    let start_ms = start * 1000;
    let children: Vec<Child> = (0..WORKERS)
        .map(|id| {
            Command::new(std::env::current_exe().expect("this program"))
                .args(["--worker", &id.to_string(), &with_min_hold.to_string()])
                .args([url, &start_ms.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a worker")
        })
        .collect();
    let mut runs: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for mut child in children {
        let out = BufReader::new(child.stdout.take().expect("piped"));
        for line in out.lines().map_while(Result::ok) {
            if let ["ran", tick, worker] = line.split(' ').collect::<Vec<_>>()[..] {
                let tick = tick.parse::<u64>().expect("a tick").saturating_sub(start);
                runs.entry(tick)
                    .or_default()
                    .push(worker.parse().expect("a worker id"));
            }
        }
        assert!(child.wait().expect("worker exits").success());
    }
    runs
}

/// Prints one line per tick; returns whether every tick ran exactly once.
fn show(runs: &BTreeMap<u64, Vec<u32>>) -> bool {
    let mut once = runs.len() as u64 == TICKS;
    for (tick, workers) in runs {
        let names: Vec<String> = workers.iter().map(|w| format!("worker {w}")).collect();
        println!("  tick {tick}: {}", names.join(", "));
        once &= workers.len() == 1;
    }
    once
}

#[tokio::main]
async fn main() {
    lock_examples::show_lock_events();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, id, with_min_hold, url, start_ms] = &args[..]
        && flag == "--worker"
    {
        let start = UNIX_EPOCH + Duration::from_millis(start_ms.parse().expect("a start time"));
        let with_min_hold = with_min_hold == "true";
        worker(id.parse().expect("a worker id"), with_min_hold, url, start).await;
        return;
    }
    let (url, _server) = redis_url_or_private_server();
    println!(
        "{WORKERS} worker processes run the report every second (locks on {url}; \
         `lockctl --url {url} watch daily-report` shows who holds it)"
    );
    println!("without min_hold (a late worker runs the tick again):");
    let without = round(&url, false);
    show(&without);
    println!(
        "with min_hold = \"800ms\" (the job to copy: send_report in examples/scheduled_job.rs):"
    );
    let with = round(&url, true);
    if show(&with) {
        println!("each of the {TICKS} ticks ran once, on one of the {WORKERS} workers");
    } else {
        println!("some tick did not run exactly once: {with:?}");
        std::process::exit(1);
    }
}

/// Whole seconds since the Unix epoch.
fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// Sleeps until `t` by this machine's clock.
async fn sleep_until(t: SystemTime) {
    if let Ok(left) = t.duration_since(SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
}
