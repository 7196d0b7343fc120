//! What a hand-off run records per worker, and the figures row 3 reports from it

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::report::{ms, percentile};

#[derive(Default)]
pub(crate) struct WorkerOut {
    count: u64,
    held: Duration,
    hold_total: Duration,
    longest_hold: Duration,
    waits: Vec<Duration>,
    /// Each hold's start and end (acquire returned, release called), for the hand-over gaps.
    holds: Vec<(Instant, Instant)>,
    /// Acquisitions that went to the worker that had waited longest (no older waiter left behind).
    pub(crate) oldest_won: u64,
}

impl WorkerOut {
    /// Records one acquisition: asked at `t0`, held from `t1` until `t2` (clipped to the run).
    pub(crate) fn record(
        &mut self,
        run: (Instant, Instant),
        t0: Instant,
        t1: Instant,
        t2: Instant,
    ) {
        let (start, end) = run;
        self.count += 1;
        self.waits.push(t1 - t0);
        self.holds.push((t1, t2));
        self.hold_total += t2 - t1;
        self.longest_hold = self.longest_hold.max(t2 - t1);
        let (from, to) = (t1.max(start), t2.min(end));
        if to > from {
            self.held += to - from;
        }
    }
}

/// When each worker started waiting (None: not waiting), to see who overtakes whom.
#[derive(Clone)]
pub(crate) struct Queue(Arc<Mutex<Vec<Option<Instant>>>>);

impl Queue {
    pub(crate) fn new(workers: usize) -> Queue {
        Queue(Arc::new(Mutex::new(vec![None; workers])))
    }

    /// Marks worker `w` as waiting since `t0`.
    pub(crate) fn start_waiting(&self, w: usize, t0: Instant) {
        self.0.lock().expect("queue")[w] = Some(t0);
    }

    /// Marks worker `w` as served; true when no worker that is still waiting started before it.
    pub(crate) fn served(&self, w: usize, t0: Instant) -> bool {
        let mut q = self.0.lock().expect("queue");
        q[w] = None;
        !q.iter().flatten().any(|&t| t < t0)
    }
}

/// How many are inside the critical section, to count entries past its `slots` (one holder
/// too many: two at once for a lock, four for 3 permits).
#[derive(Clone)]
pub(crate) struct Section {
    slots: usize,
    inside: Arc<AtomicUsize>,
    overlaps: Arc<AtomicU64>,
}

impl Section {
    pub(crate) fn new(slots: usize) -> Section {
        Section {
            slots,
            inside: Arc::default(),
            overlaps: Arc::default(),
        }
    }

    pub(crate) fn enter(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) >= self.slots {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    pub(crate) fn overlaps(&self) -> u64 {
        self.overlaps.load(Ordering::SeqCst)
    }
}

/// The figures of one hand-off run.
pub(crate) struct Handoff {
    /// Time the lock was held / length of the run (for N slots, / N times the length: the
    /// share of the slots' time that was held).
    pub(crate) utilisation: f64,
    /// Share of acquisitions that went to the longest waiter (1.0 is FIFO).
    pub(crate) oldest_share: f64,
    waits: Vec<Duration>,
    pub(crate) counts: Vec<u64>,
    pub(crate) mean_hold: Duration,
    /// The longest hold: a 1 ms pause of the worker that overran (the blocking pool's thread
    /// woken late) makes every waiter behind it wait that much longer, whatever the lock does.
    pub(crate) longest_hold: Duration,
    /// Hand-over gaps, sorted: from one holder calling release to the next holder's acquire
    /// returning (the part of a turn that is the lock's, not the body's; one slot only).
    gaps: Vec<Duration>,
    /// The longest overrun of a plain thread's 5 ms sleep during the run (see `StallProbe`):
    /// once, nothing ran that thread for at least that long.
    pub(crate) stall: Duration,
    pub(crate) overlaps: u64,
}

impl Handoff {
    /// The figures of `outs`, over `wall` for `slots` holders at once.
    pub(crate) fn from(
        outs: Vec<WorkerOut>,
        (wall, slots): (Duration, u32),
        overlaps: u64,
        stall: Duration,
    ) -> Self {
        let held: Duration = outs.iter().map(|o| o.held).sum();
        let hold_total: Duration = outs.iter().map(|o| o.hold_total).sum();
        let counts: Vec<u64> = outs.iter().map(|o| o.count).collect();
        let oldest: u64 = outs.iter().map(|o| o.oldest_won).sum();
        let longest_hold = outs
            .iter()
            .map(|o| o.longest_hold)
            .max()
            .unwrap_or_default();
        let mut holds: Vec<(Instant, Instant)> =
            outs.iter().flat_map(|o| o.holds.clone()).collect();
        holds.sort();
        let mut gaps: Vec<Duration> = holds
            .windows(2)
            .map(|w| w[1].0.saturating_duration_since(w[0].1))
            .collect();
        gaps.sort();
        let mut waits: Vec<Duration> = outs.into_iter().flat_map(|o| o.waits).collect();
        waits.sort();
        let total: u64 = counts.iter().sum();
        Self {
            utilisation: held.as_secs_f64() / (wall.as_secs_f64() * f64::from(slots)),
            oldest_share: oldest as f64 / total.max(1) as f64,
            waits,
            counts,
            mean_hold: hold_total / total.max(1) as u32,
            longest_hold,
            gaps,
            stall,
            overlaps,
        }
    }

    /// Percentile `p` of the waits for the lock.
    pub(crate) fn wait(&self, p: f64) -> Duration {
        percentile(&self.waits, p)
    }

    pub(crate) fn waits_text(&self) -> String {
        format!(
            "{} / {} / {}",
            ms(self.wait(50.0)),
            ms(self.wait(99.0)),
            ms(self.waits.last().copied().unwrap_or_default())
        )
    }

    /// Hand-over gaps, "p50 / p99 / max".
    pub(crate) fn gaps_text(&self) -> String {
        format!(
            "{} / {} / {}",
            ms(percentile(&self.gaps, 50.0)),
            ms(percentile(&self.gaps, 99.0)),
            ms(self.gaps.last().copied().unwrap_or_default())
        )
    }

    fn fair(&self) -> f64 {
        self.counts.iter().sum::<u64>() as f64 / self.counts.len() as f64
    }

    /// The smallest worker's acquisitions as a share of the fair share (1.0: all equal).
    pub(crate) fn min_share(&self) -> f64 {
        let min = self.counts.iter().min().copied().unwrap_or(0);
        min as f64 / self.fair().max(1.0)
    }

    /// "utilisation / wait p99 / smallest share".
    pub(crate) fn summary(&self) -> String {
        format!(
            "{:.3} / {} / {:.2}",
            self.utilisation,
            ms(self.wait(99.0)),
            self.min_share()
        )
    }
}
