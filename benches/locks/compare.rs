//! Cycle kinds side by side: short slices in ABBA order, ratios taken within each round

use std::time::Duration;

use tokio::time::Instant;

use crate::cycle::{Cycle, Target, cycle_name, one_cycle};
use crate::raw::command_stats;
use crate::report::{median, percentile};
use crate::threads::{ThreadClock, io_calls};

/// One task's loop: cycles on its own name until `until`; returns how many it completed.
async fn cycle_loop(t: Target, kind: Cycle, task: usize, until: Instant) -> u64 {
    let name = cycle_name(kind, task);
    let key = t.locker.key_of(&name);
    let mut raw = t.raw.clone();
    let mut n = 0u64;
    while Instant::now() < until {
        one_cycle(&t, &mut raw, kind, &name, &key, ((task as u64) << 40) | n).await;
        n += 1;
    }
    n
}

/// One slice: `tasks` concurrent tasks, each on a distinct name.
struct Slice {
    cycles: u64,
    wall: Duration,
    /// On-CPU time of this process's threads and of the server's, during the slice.
    client_ns: u64,
    server_ns: u64,
    /// The server's read and write system calls during the slice.
    server_io: (u64, u64),
    /// Script calls (EVALSHA) and the µs they ran, by INFO commandstats.
    scripts: (u64, u64),
}

impl Slice {
    fn rate(&self) -> f64 {
        self.cycles as f64 / self.wall.as_secs_f64()
    }
}

async fn run_slice(t: &Target, kind: Cycle, tasks: usize, length: Duration) -> Slice {
    let server_pid = t.server_pid.to_string();
    // Read before the clocks start (and after they stop, below): the INFO round trip is no
    // part of the slice's CPU time.
    let mut stats = t.raw.clone();
    let scripts = script_stats(&mut stats).await;
    let (client, server) = (
        ThreadClock::start("self", None),
        ThreadClock::start(&server_pid, None),
    );
    let io = io_calls(&server_pid);
    let start = Instant::now();
    let until = start + length;
    let handles: Vec<_> = (0..tasks)
        .map(|i| tokio::spawn(cycle_loop(t.clone(), kind, i, until)))
        .collect();
    let mut cycles = 0;
    for h in handles {
        cycles += h.await.expect("cycle task");
    }
    let wall = start.elapsed();
    Slice {
        cycles,
        wall,
        client_ns: client.elapsed().0,
        server_ns: server.elapsed().0,
        server_io: {
            let now = io_calls(&server_pid);
            (now.0 - io.0, now.1 - io.1)
        },
        scripts: {
            let now = script_stats(&mut stats).await;
            (now.0 - scripts.0, now.1 - scripts.1)
        },
    }
}

/// EVALSHA calls so far and the µs they ran.
async fn script_stats(conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    command_stats(conn)
        .await
        .into_iter()
        .find(|(name, _, _)| name == "evalsha")
        .map_or((0, 0), |(_, calls, usec)| (calls, usec))
}

/// The slices of a comparison: `slices[k][round]` is kind `kinds[k]` in that round.
pub(crate) struct Comparison {
    kinds: Vec<Cycle>,
    slices: Vec<Vec<Slice>>,
}

impl Comparison {
    /// A warm-up slice of every kind, then `rounds` rounds that each measure every kind once, in
    /// ABBA order (forward, then backward), so that a drift of the machine's speed hits all alike.
    pub(crate) async fn run(
        t: &Target,
        kinds: &[Cycle],
        tasks: usize,
        slice: Duration,
        rounds: usize,
    ) -> Comparison {
        for &kind in kinds {
            run_slice(t, kind, tasks, slice).await;
        }
        let mut slices: Vec<Vec<Slice>> = kinds.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..kinds.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                slices[i].push(run_slice(t, kinds[i], tasks, slice).await);
            }
        }
        Comparison {
            kinds: kinds.to_vec(),
            slices,
        }
    }

    fn of(&self, kind: Cycle) -> &[Slice] {
        let i = self
            .kinds
            .iter()
            .position(|&k| k == kind)
            .unwrap_or_else(|| panic!("{kind:?} was not measured"));
        &self.slices[i]
    }

    /// Median cycles per second over the rounds.
    pub(crate) fn rate(&self, kind: Cycle) -> f64 {
        median(self.of(kind).iter().map(Slice::rate).collect())
    }

    /// Median over the rounds of `kind`'s rate / `base`'s rate in the same round.
    pub(crate) fn ratio(&self, kind: Cycle, base: Cycle) -> f64 {
        let pairs = self.of(kind).iter().zip(self.of(base));
        median(pairs.map(|(k, b)| k.rate() / b.rate()).collect())
    }

    /// "0.93 (0.90-0.95)": the median ratio and its interquartile range over the rounds.
    pub(crate) fn ratio_text(&self, kind: Cycle, base: Cycle) -> String {
        let pairs = self.of(kind).iter().zip(self.of(base));
        let mut ratios: Vec<f64> = pairs.map(|(k, b)| k.rate() / b.rate()).collect();
        ratios.sort_by(f64::total_cmp);
        format!(
            "{:.3} ({:.2}-{:.2})",
            self.ratio(kind, base),
            percentile(&ratios, 25.0),
            percentile(&ratios, 75.0)
        )
    }

    /// CPU microseconds per cycle over all rounds: (client, server).
    pub(crate) fn cpu_us(&self, kind: Cycle) -> (f64, f64) {
        let runs = self.of(kind);
        let cycles = runs.iter().map(|s| s.cycles).sum::<u64>().max(1) as f64;
        let client: u64 = runs.iter().map(|s| s.client_ns).sum();
        let server: u64 = runs.iter().map(|s| s.server_ns).sum();
        (client as f64 / cycles / 1e3, server as f64 / cycles / 1e3)
    }

    /// Server CPU per cycle of `kind` over that of `base`, all rounds together.
    pub(crate) fn server_cpu_ratio(&self, kind: Cycle, base: Cycle) -> f64 {
        self.cpu_us(kind).1 / self.cpu_us(base).1
    }

    /// The server's read and write system calls per cycle over all rounds.
    pub(crate) fn server_io(&self, kind: Cycle) -> (f64, f64) {
        let runs = self.of(kind);
        let cycles = runs.iter().map(|s| s.cycles).sum::<u64>().max(1) as f64;
        let reads: u64 = runs.iter().map(|s| s.server_io.0).sum();
        let writes: u64 = runs.iter().map(|s| s.server_io.1).sum();
        (reads as f64 / cycles, writes as f64 / cycles)
    }

    /// µs per script call (EVALSHA) by INFO commandstats over all rounds: the script's work
    /// alone, without reading the request or writing the reply.
    pub(crate) fn script_us(&self, kind: Cycle) -> f64 {
        let runs = self.of(kind);
        let calls: u64 = runs.iter().map(|s| s.scripts.0).sum();
        let usec: u64 = runs.iter().map(|s| s.scripts.1).sum();
        usec as f64 / calls.max(1) as f64
    }

    /// "client / server" CPU µs per cycle.
    pub(crate) fn cpu_text(&self, kind: Cycle) -> String {
        let (client, server) = self.cpu_us(kind);
        format!("{client:.1} / {server:.1}")
    }
}
