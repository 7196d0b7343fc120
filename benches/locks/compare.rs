//! Cycle kinds side by side, ratios taken within each round: short slices in ABBA order, or, for
//! one task's sequential cycles, every kind's cycles interleaved in one task

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

/// One slice: `tasks` concurrent tasks, each on a distinct name (or one kind's share of an
/// interleaved round: its cycles and the time they took, without CPU figures).
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

/// Cycles of one kind in a row in an interleaved round. One at a time, each kind would also pay
/// for the code and data the others pushed out of the CPU's caches (measured: rslock, whose
/// cycle runs more instructions, then lost about 3 % more than the engine, pinned); after a few,
/// a kind runs as warm as it does alone, while the placement still holds for all of them.
pub(crate) const RUN_OF: u64 = 8;

/// One interleaved round: a single task runs `RUN_OF` cycles of every kind in a fresh random
/// order, again and again for `length` per kind, timing each run. Returns each kind's share.
async fn interleaved_round(t: &Target, kinds: &[Cycle], length: Duration, seed: u64) -> Vec<Slice> {
    let t = t.clone();
    let kinds = kinds.to_vec();
    let until = Instant::now() + length * kinds.len() as u32;
    let shares = tokio::spawn(async move {
        let names: Vec<(String, String)> = kinds
            .iter()
            .map(|&kind| {
                let name = cycle_name(kind, 0);
                let key = t.locker.key_of(&name);
                (name, key)
            })
            .collect();
        let mut raw = t.raw.clone();
        let mut order: Vec<usize> = (0..kinds.len()).collect();
        let mut shares = vec![(0u64, Duration::ZERO); kinds.len()];
        let mut rng = seed | 1;
        let mut n = 0u64;
        while Instant::now() < until {
            shuffle(&mut order, &mut rng);
            for &k in &order {
                let (name, key) = &names[k];
                let start = Instant::now();
                for _ in 0..RUN_OF {
                    one_cycle(&t, &mut raw, kinds[k], name, key, n).await;
                    n += 1;
                }
                shares[k].1 += start.elapsed();
                shares[k].0 += RUN_OF;
            }
        }
        shares
    })
    .await
    .expect("interleaved cycle task");
    shares
        .into_iter()
        .map(|(cycles, wall)| Slice {
            cycles,
            wall,
            client_ns: 0,
            server_ns: 0,
            server_io: (0, 0),
            scripts: (0, 0),
        })
        .collect()
}

/// Fisher-Yates with xorshift64: the order of one interleaved step.
pub(crate) fn shuffle(order: &mut [usize], rng: &mut u64) {
    for i in (1..order.len()).rev() {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        order.swap(i, (*rng % (i as u64 + 1)) as usize);
    }
}

/// The slices of a comparison: `slices[k][round]` is kind `kinds[k]` in that round.
pub(crate) struct Comparison {
    kinds: Vec<Cycle>,
    slices: Vec<Vec<Slice>>,
    /// Made of interleaved rounds: rates and ratios only, no CPU figures.
    interleaved: bool,
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
            interleaved: false,
        }
    }

    /// One task, `rounds` interleaved rounds (after a warm-up one), each giving every kind about
    /// `slice` of cycles. Sequential round trips on a small VM swing with where the OS runs the
    /// client's threads and the server, and that placement holds for a while: in separate
    /// slices, each kind draws its own, while interleaved, every kind's cycles run under the
    /// same one, so their ratio compares the work of the cycles.
    pub(crate) async fn interleaved(
        t: &Target,
        kinds: &[Cycle],
        slice: Duration,
        rounds: usize,
    ) -> Comparison {
        interleaved_round(t, kinds, slice, 0x9e37_79b9_7f4a_7c15).await;
        let mut slices: Vec<Vec<Slice>> = kinds.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            let shares = interleaved_round(t, kinds, slice, round as u64 + 1).await;
            for (i, share) in shares.into_iter().enumerate() {
                slices[i].push(share);
            }
        }
        Comparison {
            kinds: kinds.to_vec(),
            slices,
            interleaved: true,
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

    /// Slices of `kind` with CPU figures (not from an interleaved comparison).
    fn measured(&self, kind: Cycle) -> &[Slice] {
        assert!(
            !self.interleaved,
            "CPU and server figures come from separate slices, not interleaved rounds"
        );
        self.of(kind)
    }

    /// CPU microseconds per cycle over all rounds: (client, server).
    pub(crate) fn cpu_us(&self, kind: Cycle) -> (f64, f64) {
        let runs = self.measured(kind);
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
        let runs = self.measured(kind);
        let cycles = runs.iter().map(|s| s.cycles).sum::<u64>().max(1) as f64;
        let reads: u64 = runs.iter().map(|s| s.server_io.0).sum();
        let writes: u64 = runs.iter().map(|s| s.server_io.1).sum();
        (reads as f64 / cycles, writes as f64 / cycles)
    }

    /// µs per script call (EVALSHA) by INFO commandstats over all rounds: the script's work
    /// alone, without reading the request or writing the reply.
    pub(crate) fn script_us(&self, kind: Cycle) -> f64 {
        let runs = self.measured(kind);
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
