//! The benchmark table: the lock engine next to a floor (or a baseline) measured by this same
//! program, in the same run, against private `redis-server` processes (never the one on
//! 127.0.0.1:6379).
//!
//! Run: `cargo bench -p lock-bench` (or `cargo xtask bench`). `BENCH_ONLY=3` (or `1,4`, ...) runs
//! only those rows (1 and 2 always run together). `BENCH_SECS` (default 5) is the length of the
//! held-lease run and scales the rest: hand-off runs last 0.6 x BENCH_SECS (3 s by default), and
//! comparisons take 4 x BENCH_SECS rounds. The whole program takes about two minutes with the
//! default on a 2-vCPU machine; use `BENCH_SECS=1` while developing.
//!
//! Rows:
//! 1. uncontended cycle, one task: the engine (acquire + release, run, the attribute) vs the raw
//!    floor (`SET NX PX` + EVALSHA compare-and-delete) and vs rslock 0.10 (lock + unlock).
//! 2. 64 tasks on distinct names, and the server CPU per cycle of the engine vs the floor.
//! 3. hand-off on one name: 8 tasks on one shared `Locker`, and 8 tasks on 8 `Locker`s, 5 runs
//!    each, vs a 100 ms polling loop; beside them, the same workload on a raw FIFO hand-off (the
//!    least a fair hand-off costs here, see `handoff_floor.rs`).
//! 4. 10,000 leases held at once.
//! 5. Redlock on 3 and 5 nodes vs one node.
//! 6. the uncontended cycle over a slow link (100 µs each way) vs the floor over the same link.
//! 7. a local Redis Cluster (3+3) vs one server: uncontended cycle latency and the hand-off.
//! 8. semaphore hand-off: 8 tasks share 3 permits (row 3's workload), vs an ideal FIFO of 3
//!    slots (an in-process tokio Semaphore) running the same workload in the same run.
//!
//! Sequential round trips on loopback (rows 1, 2d and 5) depend on how fast the OS wakes a thread
//! on another CPU. On small virtual machines that can swing by 3-5x with where the OS happens to
//! run the client's threads and the server, a placement that holds for a while: two 100 ms
//! slices of the same cycle can differ by 3x. So row 1 interleaves its kinds in one task (runs
//! of 8 cycles of each, in a fresh random order each step), and every kind's cycles run under
//! the same placement; the ratios of separate slices are printed beside it, and the program
//! warns when even the interleaved ratios look affected. Pinned, client and server share one CPU
//! and both ways are stable: `BENCH_ONLY=1,2 taskset -c 0 cargo bench -p lock-bench` (the
//! redis-server processes inherit the affinity; the header says where each ran).
//!
//! Ratios are what matter: absolute figures move from machine to machine, and on a small machine
//! the client and the server(s) share the same cores. Throughput and latency are measured in
//! short slices that alternate between the variants (ABBA order; row 1 interleaved, above), and
//! each ratio is the median of the per-round ratios (with its interquartile range): a slowdown
//! of the whole machine (another process, a noisy neighbour) then hits both sides of a ratio
//! alike. CPU time per cycle (client threads and server process, from /proc schedstat; for row
//! 1, from its separate slices) is reported too: it does not depend on that noise.
//!
//! To profile one kind of cycle (with `perf`, `strace -c` or `valgrind --tool=callgrind`),
//! `BENCH_SPIN=floor` (or `rslock`, `acquire`, `attr`) runs only that cycle, in a loop, for
//! `BENCH_SECS` seconds, and prints its rate; `BENCH_HANDOFF=a` (or `b`, `floor`) runs one of
//! row 3's hand-offs for `BENCH_SECS` seconds.

mod alloc;
mod cluster;
mod compare;
mod contended;
mod crowd_floor;
mod crowds;
mod cycle;
mod delay_proxy;
mod fairness;
mod handoff;
mod handoff_floor;
mod handoff_stats;
mod held;
mod placement;
mod profile;
mod raw;
mod redlock;
mod report;
mod semaphore;
mod slow_link;
mod spread;
mod stall_probe;
mod threads;
mod uncontended;

use std::time::Duration;

use lock_runtime::LockOptions;

use contended::contended;
use held::held_leases;
use redlock::redlock;
use report::Report;
use slow_link::slow_link;
use uncontended::uncontended;

/// Lease length of the uncontended cycles (rows 1, 2, 5 and 6): long enough never to be renewed.
pub(crate) const CYCLE_TTL_MS: u64 = 10_000;
pub(crate) const CYCLE_TTL: Duration = Duration::from_millis(CYCLE_TTL_MS);
pub(crate) const CYCLE_OPTS: LockOptions = LockOptions::new(CYCLE_TTL);

fn main() {
    let secs: f64 = match std::env::var("BENCH_SECS") {
        Ok(s) => s.parse().expect("BENCH_SECS must be a number of seconds"),
        Err(_) => 5.0,
    };
    assert!(secs > 0.0, "BENCH_SECS must be above zero");
    let cfg = Config {
        secs: Duration::from_secs_f64(secs),
        handoff_run: Duration::from_secs_f64(secs * 0.6),
        slice: Duration::from_millis(100),
        rounds: ((secs * 4.0).round() as usize).max(5),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let began = std::time::Instant::now();
    let load_before = loadavg();
    let mut report = Report::default();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let wanted = |row: char| only.is_empty() || only.contains(row);
    if let Ok(kind) = std::env::var("BENCH_HANDOFF") {
        runtime.block_on(handoff_only(&kind, secs));
        return;
    }
    if let Ok(kind) = std::env::var("BENCH_SPIN") {
        runtime.block_on(spin(&kind, secs));
        return;
    }
    runtime.block_on(async {
        if wanted('1') || wanted('2') {
            uncontended(&cfg, &mut report).await;
        }
        if wanted('3') {
            contended(&cfg, &mut report).await;
        }
        if wanted('4') {
            held_leases(&cfg, &mut report).await;
        }
        if wanted('5') {
            redlock(&cfg, &mut report).await;
        }
        if wanted('6') {
            slow_link(&cfg, &mut report).await;
        }
        if wanted('7') {
            cluster::cluster(&cfg, &mut report).await;
        }
        if wanted('8') {
            semaphore::semaphore(&cfg, &mut report).await;
        }
        if wanted('9') {
            crowds::crowds(&mut report).await;
            fairness::fairness(cfg.secs * 2, &mut report).await;
        }
    });
    report.print(&cfg, began.elapsed(), &load_before);
}

pub(crate) struct Config {
    /// Length of the held-lease run; scales the rest.
    pub(crate) secs: Duration,
    /// Length of one hand-off run (3 s at the default BENCH_SECS of 5).
    pub(crate) handoff_run: Duration,
    /// Length of one throughput or latency slice.
    pub(crate) slice: Duration,
    /// Rounds of slices per comparison (each round measures every variant once).
    pub(crate) rounds: usize,
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `BENCH_HANDOFF`: one run of row 3's hand-off for `secs` seconds (`a`: one shared Locker,
/// `b`: 8 Lockers, `floor`: the raw FIFO hand-off), on a private server, for a profiler.
async fn handoff_only(kind: &str, secs: f64) {
    use handoff::{Pause, Shape, engine_handoff};
    let server = lock_testing::RedisServer::start();
    let (url, length) = (server.url(), Duration::from_secs_f64(secs));
    let run = match kind {
        "a" => engine_handoff(&url, length, Pause::Precise, Shape::SharedLocker).await,
        "b" => engine_handoff(&url, length, Pause::Precise, Shape::SeparateLockers).await,
        "floor" => handoff_floor::floor_handoff(&url, length, Pause::Precise).await,
        other => panic!("BENCH_HANDOFF={other}: give a, b or floor"),
    };
    let hand_overs: u64 = run.counts.iter().sum();
    println!("{kind}: {} ({hand_overs} hand-overs)", run.summary());
}

/// `BENCH_SPIN`: one kind of cycle in a loop for `secs` seconds, on a private server, for a
/// profiler to look at.
async fn spin(kind: &str, secs: f64) {
    use cycle::{Cycle, Target, cycle_name, one_cycle};
    let kind = match kind {
        "floor" => Cycle::Floor,
        "rslock" => Cycle::Rslock,
        "acquire" => Cycle::Acquire,
        "attr" => Cycle::Attr,
        other => panic!("BENCH_SPIN={other}: give floor, rslock, acquire or attr"),
    };
    let server = lock_testing::RedisServer::start();
    let t = Target::connect(&server.url(), server.pid()).await;
    // In a spawned task, as rows 1 and 2 run their cycles: `block_on`'s future runs on the main
    // thread, outside the runtime's workers, and would be woken across threads on every reply.
    let (cycles, elapsed) = tokio::spawn(async move {
        let mut raw = t.raw.clone();
        let name = cycle_name(kind, 0);
        let key = t.locker.key_of(&name);
        let began = std::time::Instant::now();
        let mut cycles = 0u64;
        while began.elapsed().as_secs_f64() < secs {
            for _ in 0..100 {
                one_cycle(&t, &mut raw, kind, &name, &key, cycles).await;
                cycles += 1;
            }
        }
        (cycles, began.elapsed())
    })
    .await
    .expect("spin task");
    let rate = cycles as f64 / elapsed.as_secs_f64();
    println!("{kind:?}: {rate:.0} cycles/s over {cycles} cycles");
}
