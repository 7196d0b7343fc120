//! The soak of a name that lets several holders in at once: workers hold it with their kind's
//! options and record each section's enter and leave in the store with their hold's mode; the
//! checker counts who is inside at once against what the name admits.
//!
//! A soak of another such name is a `Kind` (its options and mode) and a call of [`slots_soak`]
//! with its workers' kinds: the read-write lock's is one with shared and exclusive workers, the
//! mixed-mode soak's one with workers of every mode on one name.

use std::sync::atomic::Ordering;
use std::time::Duration;

use lock_runtime::{Lease, LockOptions, Locker};
use tokio::time::{Instant, timeout};

use super::rig::{Baseline, Forcing, Injected, Rig, inject};
use super::{Records, refused, token_of};
use crate::support::fenced::FencedStore;
use crate::support::history::{Hold, HoldMode, Mode, Report};
use crate::support::{Rng, keys_without_expiry, ms};

/// What a worker holds the name as.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// One of the name's N permits.
    Permit(u32),
    /// A shared hold of a read-write lock.
    Shared,
    /// An exclusive hold of a read-write lock.
    Exclusive,
}

impl Kind {
    fn options(self, ttl: u64, wait: u64) -> LockOptions {
        let o = LockOptions::new(ms(ttl)).with_wait(ms(wait));
        match self {
            Kind::Permit(n) => o.with_permits(n),
            Kind::Shared => o.with_shared(true),
            Kind::Exclusive => o,
        }
    }

    fn mode(self) -> HoldMode {
        match self {
            Kind::Permit(n) => HoldMode::Permit(n),
            Kind::Shared => HoldMode::Shared,
            Kind::Exclusive => HoldMode::Exclusive,
        }
    }
}

/// One worker: its kind, its locker and where it records.
struct Worker {
    id: u64,
    kind: Kind,
    name: &'static str,
    locker: Locker,
    store: FencedStore,
    records: Records,
}

impl Worker {
    /// Enter, a pause, leave: both awaited inside the hold.
    async fn section(&self, client: &str, lease: &Lease, pause: Duration) {
        let fence = lease.fence();
        let mode = self.kind.mode();
        let entered = self.store.enter_as(client, fence, mode).await;
        entered.expect("store enter");
        tokio::time::sleep(pause).await;
        self.store.leave(client, fence).await.expect("store leave");
    }

    /// A locked call whose section pauses `pause`, given up after `give_up` when there is one.
    /// Returns whether it was refused with `Config` (so do the other operations).
    async fn run(&self, o: &LockOptions, pause: Duration, give_up: Option<Duration>) -> bool {
        let (client, began) = (format!("t{}.run", self.id), Instant::now());
        let mut token = None;
        let call = self.locker.run(self.name, o, async |lease| {
            token = Some(token_of(lease));
            self.records.grants.record(began, lease);
            self.section(&client, lease, pause).await
        });
        match timeout(give_up.unwrap_or(Duration::MAX), call).await {
            Ok(res) => {
                self.records.losses.record(token, &res);
                self.records.counts.record(&res);
                refused(&res)
            }
            Err(_) => {
                let cancelled = &self.records.counts.cancelled;
                cancelled.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// By hand: acquire, section, release. Nothing cancels the section: if the lease is lost
    /// meanwhile, the release says so.
    async fn manual(&self, o: &LockOptions, pause: Duration) -> bool {
        let (client, began) = (format!("t{}.manual", self.id), Instant::now());
        match self.locker.acquire(self.name, o).await {
            Ok(lease) => {
                self.records.grants.record(began, &lease);
                self.section(&client, &lease, pause).await;
                let token = token_of(&lease);
                let released = lease.release().await;
                self.records.counts.record(&released);
                self.records.losses.record(Some(token), &released);
                false
            }
            Err(e) => {
                let res = Err::<(), _>(e);
                self.records.counts.record(&res);
                refused(&res)
            }
        }
    }

    /// Takes a lease and lets it go without a section: dropped, or its release given up after
    /// `give_up`.
    async fn take_and_let_go(&self, o: &LockOptions, give_up: Option<Duration>) -> bool {
        let began = Instant::now();
        let counts = &self.records.counts;
        match self.locker.acquire(self.name, o).await {
            Ok(lease) => {
                self.records.grants.record(began, &lease);
                match give_up {
                    None => {
                        drop(lease);
                        counts.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(after) => match timeout(after, lease.release()).await {
                        Ok(res) => counts.record(&res),
                        Err(_) => _ = counts.cancelled.fetch_add(1, Ordering::Relaxed),
                    },
                }
                false
            }
            Err(e) => {
                let res = Err::<(), _>(e);
                counts.record(&res);
                refused(&res)
            }
        }
    }

    /// Random operations until `until`, as the lock's soak makes them.
    async fn work(self, seed: u64, until: Instant) {
        let mut rng = Rng::new(seed ^ (self.id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        while Instant::now() < until {
            let ttl = rng.pick(&[200u64, 300, 500, 800]);
            let o = self.kind.options(ttl, rng.pick(&[0u64, 50, 300, 1_000]));
            // Mostly short; one in four long enough for a fault to land mid-section.
            let pause = if rng.below(4) == 0 {
                rng.ms(0, ttl / 2)
            } else {
                rng.ms(0, 5)
            };
            let refused = match rng.below(8) {
                0..=2 => self.run(&o, pause, None).await,
                3 => self.manual(&o, pause).await,
                // The caller gives up mid-section, or during the acquire or the wait.
                4 => self.run(&o, ms(50), Some(rng.ms(0, 60))).await,
                5 => self.run(&o, pause, Some(rng.ms(0, 40))).await,
                // A section that runs past max_exec.
                6 => {
                    self.run(&o.with_max_exec(ms(ttl / 4)), ms(ttl / 2), None)
                        .await
                }
                _ => {
                    let give_up = (rng.below(2) == 0).then(|| rng.ms(0, 3));
                    self.take_and_let_go(&o, give_up).await
                }
            };
            // A caller refused for its mode comes back later, as a job run again would: not in
            // a loop that takes the cores from the others.
            if refused {
                tokio::time::sleep(rng.ms(10, 50)).await;
            }
        }
    }
}

/// What a soak of several holders leaves to check.
pub struct SlotsSoak {
    /// The history, checked against what the workers' modes admit together, with the holds a
    /// fault entitled to be there excused (see `entitled`).
    pub report: Report,
    pub records: Records,
    pub injected: Injected,
    /// The lock server's keys without an expiry once the workers were done (`key (type)`).
    pub forever: Vec<String>,
}

/// `kinds.len()` workers (one task each, on four lockers in turn) hold `name` under random
/// faults (`super::rig::inject`, held keys taken as `forcing` says) for the rig's length; then
/// no task or connection is left over.
pub async fn slots_soak(
    name: &'static str,
    kinds: &[Kind],
    forcing: Forcing,
    default_secs: u64,
) -> SlotsSoak {
    let rig = Rig::start(name, Mode::Unfenced, default_secs).await;
    let baseline = Baseline::take(&rig);
    let records = Records::default();
    let started = Instant::now();
    let until = started + rig.length();
    let injected = {
        let lockers = rig.lockers().await;
        let workers: Vec<_> = (0..kinds.len())
            .map(|i| Worker {
                id: i as u64,
                kind: kinds[i],
                name,
                locker: lockers[i % lockers.len()].clone(),
                store: rig.store.clone(),
                records: records.clone(),
            })
            .map(|w| tokio::spawn(w.work(rig.seed, until)))
            .collect();
        let injected = inject(&rig, &lockers[0], name, forcing, (started, until)).await;
        for w in workers {
            let waited = timeout(Duration::from_secs(60), w).await;
            waited
                .expect("a worker hung after the soak")
                .expect("worker panicked");
        }
        injected
    };
    baseline.assert_back(&rig).await;
    let forever = keys_without_expiry(&rig.server.url()).await;
    println!("{} faults: {:?}", injected.faults.len(), injected.faults);
    println!("{}", records.counts);
    let mut report = rig.store.check().await.unwrap();
    let entitled = entitled(&records, &injected);
    report.excuse(|h| entitled(h));
    SlotsSoak {
        report,
        records,
        injected,
        forever,
    }
}

/// The holds that may have been inside past what the name admits, through a fault the name
/// cannot stop: whatever deletes a held key lets the next holder in, and its holder learns at
/// its next renewal (see docs/guarantees.md, "What Redis must not lose"). Those are the holds of
/// keys the injector took while their call ran (a permit holder's own, or the permits' mark on
/// the lock's key, which lets the other modes in beside every permit holder), those that ran
/// across the restart on a lease granted before it, and the uncancelled sections by hand whose
/// release did not report success (their lease may have run out under them, as a blocked body's
/// would). A `run` section is not excused: its body never runs past its lease's validity, which
/// ends before the key's expiry.
fn entitled(records: &Records, injected: &Injected) -> impl Fn(&Hold) -> bool + use<> {
    let fences = records.grants.fences.lock().unwrap();
    let losses = &records.losses;
    let forced: Vec<u64> = injected
        .forced
        .iter()
        .chain(&injected.unmarked)
        .filter(|f| !losses.returned_before(&f.token, f.at))
        .filter_map(|f| fences.get(&f.token).copied())
        .collect();
    let released: std::collections::HashSet<u64> = losses
        .returned
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.ok)
        .map(|r| r.fence)
        .collect();
    let restart = injected.restart;
    move |h: &Hold| {
        let crashed = restart
            .is_some_and(|r| h.fence < r.fence_floor && h.end.is_some_and(|end| end > r.before));
        let unreleased = h.client.ends_with(".manual") && !released.contains(&h.fence);
        crashed || unreleased || forced.contains(&h.fence)
    }
}

/// What every soak of several holders asserts: nobody inside past what the name admits (apart
/// from the holds a fault entitled), `fill` holders inside at once at some moment (so a checker
/// that admitted fewer would have seen a crowd), every holder whose key was taken told so,
/// fences in real-time order, the faults happened, and every key the engine left expires.
pub fn assert_sound(soak: &SlotsSoak, fill: usize) {
    let (report, records) = (&soak.report, &soak.records);
    println!("{report}");
    assert_eq!(
        report.violations(),
        0,
        "more inside than admitted: {report}"
    );
    assert!(
        report.most_inside >= fill,
        "never {fill} inside at once: the run did not fill the name: {report}"
    );
    let unreported = records.losses.unreported(&soak.injected.forced);
    println!(
        "{} keys taken from under their holders, {} of their calls reported success",
        soak.injected.forced.len(),
        unreported.len()
    );
    assert!(!soak.injected.forced.is_empty(), "no held key was taken");
    assert!(
        unreported.is_empty(),
        "losses reported as success: {unreported:?}"
    );
    records.assert_fences_in_order();
    // The faults the name cannot stop happened: held keys deleted (above) and the crash. Calls
    // that failed are no proof here: a run of a few seconds can see none.
    assert!(soak.injected.restart.is_some(), "Redis was not restarted");
    let counts = &records.counts;
    assert!(
        counts.sections.load(Ordering::Relaxed) > 0,
        "no section ran: {counts}"
    );
    assert!(
        soak.forever.is_empty(),
        "keys without an expiry after the soak: {}",
        soak.forever.join(", ")
    );
}
