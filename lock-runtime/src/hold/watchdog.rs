//! The renewal watchdog: one task per locker renews every held lease, in batches.
//!
//! Leases wait in one schedule ordered by their next renewal. Each wake-up takes every lease due
//! (and, once one is due, those due within a quarter of their renew period) and renews them in
//! chunks of up to 1,000 keys per script call; every chunk of a round goes out at once, so 10,000
//! held leases cost a handful of pipelined script calls per period, not 10,000 timers. A lease
//! holds a [`Renewing`] handle; dropping or stopping it takes the lease out of the schedule.
//!
//! A lease's next renewal is scheduled when one is sent, one period later, whatever becomes of
//! the one sent: on a link whose round trip is long next to the lease, several renewals of a
//! lease are in flight at once, and the period shrinks with the measured round trip (see
//! `renew_period`). Each confirmed renewal counts from its own send time, so the lease stays
//! valid as long as renewals reach the server in time. A lease whose acquire is slow to answer
//! is renewed before the reply comes (see `LeaseState::provisional`); a denial of such an early
//! renewal proves nothing (the acquire may reach the server after it on another connection) and
//! is only retried.
//!
//! The task runs in the runtime of the call that started it. A locker may be used from several
//! runtimes (a process-wide default locker under `#[tokio::test]`s, each with its own), and the
//! task's runtime may shut down while other runtimes' leases are held: the task then moves to a
//! runtime that registered one of them, and the leases a dropped round had taken out of the
//! schedule go back into it, due at once. Leases held although no runtime that registered one
//! is left (taken in a runtime, held in another that took none) are renewed by a thread of the
//! watchdog's own until they end.

use crate::plumbing::background::{Added, Idle, ServedByTask, Task, TaskClaim, nap};
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::LostReason;
use crate::deployment::{Deployment, Renewal};
use crate::plumbing::unpoisoned::Unpoisoned;
use crate::state::lease_state::LeaseState;

/// The renewal schedule of one locker.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    deployment: Arc<Deployment>,
    schedule: Mutex<Schedule>,
    wake: Notify,
}

#[derive(Default)]
struct Schedule {
    /// Leases by next renewal time (the id breaks ties).
    due: BTreeMap<(Instant, u64), Arc<LeaseState>>,
    /// Where each lease sits in `due`.
    at: HashMap<u64, Instant, BuildHasherDefault<IdHasher>>,
    next_id: u64,
    /// The renewal task (it lingers a while without leases: a steady acquire/release loop
    /// reuses one task instead of spawning one per lease).
    task: Task,
    /// The runtimes that registered the leases held now, with how many each: where the task
    /// moves if its own runtime shuts down. Usually one.
    runtimes: Vec<(Handle, usize)>,
}

impl Schedule {
    /// Schedules lease `id` at `when`, where it sat elsewhere; true if it is the earliest now.
    fn put(&mut self, id: u64, when: Instant, lease: Arc<LeaseState>) -> bool {
        if let Some(old) = self.at.insert(id, when) {
            self.due.remove(&(old, id));
        }
        let earliest = self
            .due
            .keys()
            .next()
            .is_none_or(|&first| (when, id) < first);
        self.due.insert((when, id), lease);
        earliest
    }

    /// Moves lease `id` to `when` if that is sooner, unless it was stopped meanwhile.
    fn sooner(&mut self, id: u64, when: Instant, lease: Arc<LeaseState>) {
        if self.at.get(&id).is_some_and(|&at| when < at) {
            self.put(id, when, lease);
        }
    }

    /// Takes lease `id` out of the schedule.
    fn remove(&mut self, id: u64) {
        if let Some(when) = self.at.remove(&id) {
            self.due.remove(&(when, id));
        }
    }
}

/// Hashes the schedule's lease ids, which this process numbers itself (no untrusted keys): a
/// multiply instead of SipHash, on a path every lease takes three times.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing: sequential ids spread over the table's high bits.
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A lease's place in the schedule: [`Renewing::stop`] or dropping it takes the lease out
/// (released, dropped or lost). Also the lease's way to its locker's servers: a lease holds
/// nothing else of its locker.
pub(crate) struct Renewing {
    /// 0 once stopped (ids start at 1).
    id: u64,
    /// The runtime that registered the lease.
    runtime: Id,
    shared: Arc<Shared>,
}

impl Renewing {
    /// The servers of the lease's locker.
    pub(crate) fn deployment(&self) -> &Arc<Deployment> {
        &self.shared.deployment
    }

    /// Takes the lease out of the schedule; once only.
    pub(crate) fn stop(&mut self) {
        if self.id == 0 {
            return;
        }
        let id = std::mem::take(&mut self.id);
        let mut s = self.shared.schedule.locked();
        s.remove(id);
        if let Some(at) = s.runtimes.iter().position(|(h, _)| h.id() == self.runtime) {
            s.runtimes[at].1 -= 1;
            if s.runtimes[at].1 == 0 {
                // Dropped at once: a runtime that shut down is not kept alive by its handle.
                let gone = s.runtimes.swap_remove(at);
                drop(s);
                drop(gone);
            }
        }
    }
}

impl Drop for Renewing {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The running task's claim. If the task is dropped early (its runtime shut down), a new one
/// starts in another runtime that registered one of the leases held, if any.
type RunningGuard = TaskClaim<Shared>;

impl ServedByTask for Shared {
    type Schedule = Schedule;

    fn schedule(&self) -> &Mutex<Schedule> {
        &self.schedule
    }

    fn task_dropped(self: &Arc<Self>, mut s: MutexGuard<'_, Schedule>) {
        // The task's runtime shut down (or the task panicked): forget that runtime, whose
        // leases end with it, and go to another runtime with leases, if there is one.
        let gone: Vec<(Handle, usize)> = match s.task.home() {
            Some(home) => s.runtimes.extract_if(.., |(h, _)| h.id() == home).collect(),
            None => Vec::new(),
        };
        let panicking = std::thread::panicking();
        let next = match s.runtimes.first() {
            Some((next, _)) if !panicking => Some(next.clone()),
            _ => None,
        };
        // Leases are held, but no runtime that registered one is left: they were moved out of
        // the runtimes that registered them (or are about to be dropped with the one that shut
        // down). Nothing else would renew them.
        let stranded = next.is_none() && !panicking && !s.at.is_empty();
        if next.is_some() || stranded {
            // In `next`, or in the thread's own runtime, which names itself once it runs.
            s.task.start_in(next.as_ref().map(Handle::id));
        } else {
            s.task.exited();
        }
        // The handles are dropped outside the lock.
        drop(s);
        drop(gone);
        match next {
            // If `next` has shut down too, the task is dropped at once, and its guard forgets
            // `next` and tries the next runtime.
            Some(next) => drop(next.spawn(run(RunningGuard::new(Arc::clone(self))))),
            None if stranded => renew_in_a_thread(Arc::clone(self)),
            None => {}
        }
    }
}

/// Runs the renewal task in a thread of its own, with a runtime of its own, until the schedule
/// is empty (it stops as an idle task does): for leases that no live runtime registered. The
/// runtime is made in the thread: the caller may be a runtime's worker shutting down, where a
/// runtime that failed to start could not be dropped.
fn renew_in_a_thread(shared: Arc<Shared>) {
    let inner = Arc::clone(&shared);
    let started = std::thread::Builder::new()
        .name("lock-renewal".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(async {
                    let here = Some(Handle::current().id());
                    inner.schedule.locked().task.start_in(here);
                    run(RunningGuard::new(inner)).await;
                }),
                Err(e) => not_renewed(&inner, &e),
            }
        });
    if let Err(e) = started {
        not_renewed(&shared, &e);
    }
}

/// The renewal thread could not start: the leases wait for the next registration to start a
/// task again.
fn not_renewed(shared: &Shared, e: &std::io::Error) {
    shared.schedule.locked().task.exited();
    tracing::error!(
        target: "lock_runtime::hold",
        error = %e,
        "no thread for the renewals of leases held outside the runtimes that took them: \
         they are renewed again once another lease is taken"
    );
}

/// Leases a round renews and has not decided yet. If the round is dropped (its runtime shut
/// down), they are due again at once.
struct Outstanding {
    shared: Arc<Shared>,
    leases: Vec<(u64, Arc<LeaseState>)>,
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let mut s = self.shared.schedule.locked();
        let now = Instant::now();
        for (id, lease) in self.leases.drain(..) {
            s.sooner(id, now, lease);
        }
        drop(s);
        self.shared.wake.notify_one();
    }
}

impl Watchdog {
    pub(crate) fn new(deployment: Arc<Deployment>) -> Self {
        Self {
            shared: Arc::new(Shared {
                deployment,
                schedule: Mutex::default(),
                wake: Notify::new(),
            }),
        }
    }

    /// Starts renewing `lease`, first at `when` (one renew period after the acquire was sent;
    /// sooner for a lock granted by a release, which holds the key for a grace only).
    pub(crate) fn register(&self, lease: Arc<LeaseState>, when: Instant) -> Renewing {
        let here = Handle::current();
        let runtime = here.id();
        let mut s = self.shared.schedule.locked();
        s.next_id += 1;
        let id = s.next_id;
        s.put(id, when, lease);
        match s.runtimes.iter_mut().find(|(h, _)| h.id() == runtime) {
            Some((_, leases)) => *leases += 1,
            None => s.runtimes.push((here, 1)),
        }
        match s.task.added(when, runtime) {
            Added::Spawn => {
                drop(s);
                let guard = RunningGuard::new(Arc::clone(&self.shared));
                tokio::spawn(run(guard));
            }
            Added::Wake => {
                drop(s);
                self.shared.wake.notify_one();
            }
            Added::Nothing => {}
        }
        Renewing {
            id,
            runtime,
            shared: Arc::clone(&self.shared),
        }
    }
}

async fn run(mut guard: RunningGuard) {
    let shared = Arc::clone(guard.shared());
    let mut idle = Idle::default();
    loop {
        let rtt = shared.deployment.rtt();
        let now = Instant::now();
        let wake_at = {
            let mut s = shared.schedule.locked();
            let (batch, next) = take_due(&mut s, now, rtt);
            if !batch.is_empty() {
                s.task.busy();
                drop(s);
                idle.busy();
                let chunks = batch
                    .chunks(shared.deployment.renew_chunk())
                    .map(|chunk| Outstanding {
                        shared: Arc::clone(&shared),
                        leases: chunk.to_vec(),
                    })
                    .collect();
                tokio::spawn(renew_round(chunks));
                continue;
            }
            // Stops under the lock when it has lingered long enough: a new lease either
            // landed before this, or finds no task and starts one (the guard is disarmed, so
            // that its drop cannot stop that new task).
            match s.task.plan(&mut idle, now, next, &mut guard) {
                Some(at) => at,
                None => return,
            }
        };
        nap(wake_at, &shared.wake).await;
    }
}

/// Returns every live lease that is due, plus, once one is due, those due within a quarter of
/// their period (renewed a little early, in the same round trip), each scheduled again one
/// period (for round trips of `rtt`) from `now`, when its renewal is sent; also returns when the
/// next one is due.
fn take_due(
    s: &mut Schedule,
    now: Instant,
    rtt: Duration,
) -> (Vec<(u64, Arc<LeaseState>)>, Option<Instant>) {
    let mut batch = Vec::new();
    while let Some((&(when, id), lease)) = s.due.first_key_value() {
        if !lease.is_ended()
            && (when > now + lease.period(rtt) / 4 || (batch.is_empty() && when > now))
        {
            break;
        }
        let (_, lease) = s.due.pop_first().expect("present");
        s.at.remove(&id);
        if !lease.is_ended() {
            batch.push((id, lease));
        }
    }
    for (id, lease) in &batch {
        s.put(*id, now + lease.period(rtt), Arc::clone(lease));
    }
    (batch, s.due.keys().next().map(|&(when, _)| when))
}

/// Renews one batch: every chunk of the round goes out at once (they pipeline on each server's
/// connection), so chunk k is not confirmed k round trips late, and each chunk is decided as
/// soon as its replies are in.
async fn renew_round(chunks: Vec<Outstanding>) {
    crate::plumbing::fanout::join_all(chunks.into_iter().map(renew_chunk).collect()).await;
}

async fn renew_chunk(mut outstanding: Outstanding) {
    let sent = Instant::now();
    let leases: Arc<Vec<Arc<LeaseState>>> = Arc::new(
        outstanding
            .leases
            .iter()
            .map(|(_, l)| Arc::clone(l))
            .collect(),
    );
    // Renewed before their acquire was answered (usually none).
    let early: Vec<usize> = (0..leases.len())
        .filter(|&i| !leases[i].is_granted())
        .collect();
    let shared = Arc::clone(&outstanding.shared);
    let renewals = shared.deployment.renew(&leases).await;
    // Decided: no longer the drop's to make due again.
    let chunk = std::mem::take(&mut outstanding.leases);
    let mut failed = Failed::default();
    let mut s = shared.schedule.locked();
    let now = Instant::now();
    for (i, ((id, lease), verdict)) in chunk.into_iter().zip(renewals.verdicts).enumerate() {
        if lease.is_ended() {
            continue;
        }
        let verdict = match verdict {
            // The early renewal may have reached the server before the acquire did.
            Renewal::NotOwner | Renewal::NotReplicated if early.binary_search(&i).is_ok() => {
                Renewal::Undecided
            }
            Renewal::Undecided => {
                if let Some(error) = &renewals.error
                    && lease.is_granted()
                    && lease.renewal_failed(error)
                {
                    failed.add(&lease);
                }
                Renewal::Undecided
            }
            verdict => verdict,
        };
        decide(&mut s, id, lease, verdict, sent, now);
    }
    drop(s);
    shared.wake.notify_one();
    if let (Some(lease), Some(error)) = (failed.first, &renewals.error) {
        crate::plumbing::telemetry::renewal_failed(lease.label(), failed.leases, error);
    }
}

/// The leases of a chunk whose renewal failed for the first time in their hold: logged once.
#[derive(Default)]
struct Failed {
    first: Option<Arc<LeaseState>>,
    leases: usize,
}

impl Failed {
    fn add(&mut self, lease: &Arc<LeaseState>) {
        self.first.get_or_insert_with(|| Arc::clone(lease));
        self.leases += 1;
    }
}

/// Acts on what a renewal sent at `sent` came to: the lease stays in the schedule (at its next
/// renewal, or sooner to retry), or leaves it lost.
fn decide(
    s: &mut Schedule,
    id: u64,
    lease: Arc<LeaseState>,
    verdict: Renewal,
    sent: Instant,
    now: Instant,
) {
    match verdict {
        // A confirmation after the validity ran out leaves the lease lost.
        Renewal::Renewed if lease.confirm(sent) => {}
        Renewal::Renewed => s.remove(id),
        Renewal::NotOwner => {
            lease.mark_lost(LostReason::NotOwner);
            s.remove(id);
        }
        Renewal::NotReplicated => {
            lease.mark_lost(LostReason::NotReplicated);
            s.remove(id);
        }
        Renewal::Undecided if now >= lease.valid_until() => {
            lease.mark_lost(lease.expired_reason());
            s.remove(id);
        }
        Renewal::Undecided => {
            // No majority answered: try again soon, while the lease is still valid.
            let retry =
                (lease.renew / 4).clamp(Duration::from_millis(5), Duration::from_millis(100));
            s.sooner(id, now + retry, lease);
        }
    }
}
