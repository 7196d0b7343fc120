//! Soaks: tasks on 4 lockers (one straight to Redis, three through fault proxies) run mixed
//! locked sections on one name while random faults hit (`soak/rig.rs`): proxy delays, blackholes
//! and resets, Redis frozen, held keys taken from under their holders, callers dropped at random
//! points of acquire, wait, body and release, and one Redis crash (`kill -9`) and restart that
//! loads an older snapshot (taken a third of the way in). Every section is recorded in a fenced
//! store's history, which the checker reads at the end; once every locker is dropped, the
//! runtime's task count and Redis's client list are back to their baseline, and no key the
//! engine left on the lock server lacks an expiry.
//!
//! - The lock (16 tasks, `SOAK_SECS` seconds, default 60): 0 safety violations in the history;
//!   fences grow in real-time order across everything, the restart included; no call whose
//!   lease was force-released reports success; nested sections joined in one body never run at
//!   once. `#[ignore]`d: run it with `cargo test --test soak -- --include-ignored` (the README's
//!   test command and `.ci/run` do).
//! - Permits (`soak/slots.rs`: 8 tasks, 3 permits, default 5 s): never more than 3 inside at
//!   once, apart from the holders a fault took a key from (they are told), with an unsafe
//!   control in which a key taken under its holder lets a fourth in and the checker sees it.
//! - The read-write lock (6 shared, 2 exclusive tasks, default 5 s): no exclusive holder inside
//!   with another, with an unsafe control in which the key deleted under two shared holders
//!   lets a writer in.
//! - Every mode on one name (exclusive, shared, `permits = 3`, `permits = 2`; default 8 s): no
//!   two holds of modes that exclude each other inside at once; a caller refused with `Config`
//!   for its mode or N is counted, not a failure. Unsafe control: sections of the other modes
//!   entered without the lock beside permit holders are crowds the checker reports.
//! - Shared holders that crash (`soak/crashes.rs`, default 5 s): shared holder processes
//!   (`lock_holder`, lease 300 ms) killed with SIGKILL while they hold, beside live shared holders
//!   and writers: no writer waits for a dead holder past its lease (plus a margin), and some
//!   writer did wait for one.
//! - Slow links (`soak/slow.rs`, default 5 s): leases of 1 s through proxies delaying 0 to 300 ms
//!   each way: no lease told `Lost` while the server still held its key (read straight from the
//!   server at that moment), and leases were renewed over the slowest link.
//!
//! `SOAK_SECS` sets the length of each soak, `SOAK_SEED` replays a run (the seed is printed).

pub mod support;

#[path = "soak/crashes.rs"]
mod crashes;
#[path = "soak/rig.rs"]
mod rig;
#[path = "soak/slots.rs"]
mod slots;
#[path = "soak/slow.rs"]
mod slow;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{Lease, LockError, LockOptions, Locker};
use lock_testing::RedisServer;
use rig::{Baseline, Forced, Forcing, Injected, Rig, inject};
use slots::{Kind, assert_sound, slots_soak};
use support::fenced::FencedStore;
use support::history::{Hold, HoldMode, Mode, Report};
use support::{Rng, assert_every_key_expires, ms};
use tokio::time::{Instant, timeout};

/// Outcomes of the operations, by kind.
#[derive(Default)]
struct Counts {
    sections: AtomicU64,
    busy: AtomicU64,
    lost: AtomicU64,
    max_exec: AtomicU64,
    redis: AtomicU64,
    /// Refused: the caller's mode or number of permits disagrees with the name's holders'.
    config: AtomicU64,
    cancelled: AtomicU64,
    dropped: AtomicU64,
    other: AtomicU64,
}

/// Whether `res` is a refusal for another mode or N (`Config`).
fn refused<T>(res: &Result<T, LockError>) -> bool {
    matches!(res, Err(LockError::Config { .. }))
}

impl Counts {
    fn record<T>(&self, res: &Result<T, LockError>) {
        let counter = match res {
            Ok(_) => &self.sections,
            Err(LockError::Busy { .. }) => &self.busy,
            Err(LockError::Lost { .. }) => &self.lost,
            Err(LockError::MaxExecExceeded { .. }) => &self.max_exec,
            Err(LockError::Redis { .. }) => &self.redis,
            Err(LockError::Config { .. }) => &self.config,
            Err(_) => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        write!(
            f,
            "{} sections done, {} busy, {} lost, {} max_exec, {} redis errors, {} refused for \
             another mode or N (Config), {} cancelled by the caller, {} leases dropped unreleased, \
             {} other errors",
            g(&self.sections),
            g(&self.busy),
            g(&self.lost),
            g(&self.max_exec),
            g(&self.redis),
            g(&self.config),
            g(&self.cancelled),
            g(&self.dropped),
            g(&self.other)
        )
    }
}

const NAME: &str = "soak";

/// What the loss checks need: what the calls that held a lease returned, and nested sections
/// seen inside one body at once.
#[derive(Default)]
struct Losses {
    returned: Mutex<Vec<Returned>>,
    nested_bodies: AtomicU64,
    nested_overlaps: AtomicU64,
}

/// What one call that held a lease returned, and when.
#[derive(Clone)]
struct Returned {
    token: String,
    fence: u64,
    ok: bool,
    at: Instant,
}

impl Losses {
    fn record<T>(&self, token: Option<(String, u64)>, res: &Result<T, LockError>) {
        if let Some((token, fence)) = token {
            let (ok, at) = (res.is_ok(), Instant::now());
            let returned = Returned {
                token,
                fence,
                ok,
                at,
            };
            self.returned.lock().unwrap().push(returned);
        }
    }

    /// The calls that held a lease while a key holding its token was taken. A call that had
    /// returned already held nothing: after a restart from an older snapshot, the queue of that
    /// moment comes back, and a release may hand the lock to the token of a waiter that got in
    /// and left meanwhile.
    fn taken_under(&self, forced: &[Forced]) -> Vec<Returned> {
        let returned = self.returned.lock().unwrap();
        returned
            .iter()
            .filter(|r| forced.iter().any(|f| f.token == r.token && f.at <= r.at))
            .cloned()
            .collect()
    }

    /// Calls that reported success although their key was taken from under them.
    fn unreported(&self, forced: &[Forced]) -> Vec<String> {
        let taken = self.taken_under(forced).into_iter();
        taken.filter(|r| r.ok).map(|r| r.token).collect()
    }

    /// The fences of the leases whose key was taken from under them.
    fn forced_fences(&self, forced: &[Forced]) -> HashSet<u64> {
        self.taken_under(forced)
            .into_iter()
            .map(|r| r.fence)
            .collect()
    }

    /// Whether the call that held `token` had returned before `at`.
    fn returned_before(&self, token: &str, at: Instant) -> bool {
        let returned = self.returned.lock().unwrap();
        returned.iter().any(|r| r.token == token && r.at < at)
    }
}

/// The token part of a lease's value (what `Holder::token` reads back), and its fence.
fn token_of(lease: &Lease) -> (String, u64) {
    let token = lease.token().split(';').next().unwrap_or_default();
    (token.to_owned(), lease.fence())
}

/// Nested sections joined in one body, each counting how many are inside at once.
async fn nested_sections(locker: &Locker, o: &LockOptions, losses: &Losses) {
    let inside = AtomicU64::new(0);
    let most = AtomicU64::new(0);
    let one = async || {
        let _ = locker
            .run(NAME, o, async |_| {
                most.fetch_max(inside.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(ms(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            })
            .await;
    };
    tokio::join!(one(), one(), one());
    losses.nested_bodies.fetch_add(1, Ordering::Relaxed);
    if most.load(Ordering::SeqCst) > 1 {
        losses.nested_overlaps.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every lease handed out: when its call began, when the lease was in hand, and its fence; and
/// the fence of each token (a key's value names its lease by token).
#[derive(Default)]
struct Grants {
    times: Mutex<Vec<(Instant, Instant, u64)>>,
    fences: Mutex<HashMap<String, u64>>,
}

impl Grants {
    fn record(&self, began: Instant, lease: &Lease) {
        let (token, fence) = token_of(lease);
        self.times
            .lock()
            .unwrap()
            .push((began, Instant::now(), fence));
        self.fences.lock().unwrap().insert(token, fence);
    }

    /// Pairs where a lease handed out entirely after another one has a fence that is not above
    /// it: `(earlier fence, later fence)`.
    fn backwards(&self) -> Vec<(u64, u64)> {
        let mut grants = self.times.lock().unwrap().clone();
        grants.sort_by_key(|&(_, got, _)| got);
        // Highest fence among the grants in hand at or before each point.
        let mut best = Vec::with_capacity(grants.len());
        let mut max = 0;
        for &(_, _, fence) in &grants {
            max = max.max(fence);
            best.push(max);
        }
        let mut out = Vec::new();
        for &(began, _, fence) in &grants {
            let before = grants.partition_point(|&(_, got, _)| got < began);
            if before > 0 && best[before - 1] >= fence {
                out.push((best[before - 1], fence));
            }
        }
        out
    }

    fn len(&self) -> usize {
        self.times.lock().unwrap().len()
    }
}

/// A fenced read-modify-write, with a pause between the read and the write.
async fn section(store: &FencedStore, client: &str, lease: &Lease, pause: Duration) {
    let entered = store
        .enter(client, lease.fence())
        .await
        .expect("store enter");
    tokio::time::sleep(pause).await;
    store
        .write(client, lease.fence(), entered.basis)
        .await
        .expect("store write");
}

/// What the workers record, for the checks at the end.
#[derive(Clone, Default)]
struct Records {
    counts: Arc<Counts>,
    grants: Arc<Grants>,
    losses: Arc<Losses>,
}

impl Records {
    /// A lease handed out entirely after another one has a higher fence.
    fn assert_fences_in_order(&self) {
        let backwards = self.grants.backwards();
        println!(
            "{} leases handed out; fences in real-time order: {} out of order",
            self.grants.len(),
            backwards.len()
        );
        assert!(
            backwards.is_empty(),
            "a lease got a fence not above one handed out before it began: {:?}",
            &backwards[..backwards.len().min(5)]
        );
    }
}

/// One task: random operations until `until`.
async fn worker(
    id: u64,
    seed: u64,
    locker: Locker,
    store: FencedStore,
    records: Records,
    until: Instant,
) {
    let Records {
        counts,
        grants,
        losses,
    } = records;
    let mut rng = Rng::new(seed ^ (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    while Instant::now() < until {
        let ttl = rng.pick(&[200u64, 300, 500, 800]);
        let wait = rng.pick(&[0u64, 50, 300, 1_000]);
        let o = LockOptions::new(ms(ttl)).with_wait(ms(wait));
        // Mostly short; one in four long enough for a fault to land mid-body.
        let pause = if rng.below(4) == 0 {
            rng.ms(0, ttl / 2)
        } else {
            rng.ms(0, 5)
        };
        let began = Instant::now();
        match rng.below(9) {
            // The locked call, as the attribute makes it.
            0 | 1 => {
                let client = format!("t{id}.run");
                let mut token = None;
                let res = locker
                    .run(NAME, &o, async |lease| {
                        token = Some(token_of(lease));
                        grants.record(began, lease);
                        section(&store, &client, lease, pause).await
                    })
                    .await;
                counts.record(&res);
                losses.record(token, &res);
            }
            // Nested sections on the same name, joined inside one locked body.
            8 => {
                let o = lock_runtime::__private::without_fence(o);
                let res = locker
                    .run(NAME, &o, async |_| {
                        nested_sections(&locker, &o, &losses).await
                    })
                    .await;
                counts.record(&res);
            }
            // The caller gives up during acquire or the wait: the future is dropped.
            6 => match timeout(rng.ms(0, 40), locker.acquire(NAME, &o)).await {
                Ok(Ok(lease)) => {
                    grants.record(began, &lease);
                    counts.record(&lease.release().await);
                }
                Ok(Err(e)) => counts.record::<()>(&Err(e)),
                Err(_) => {
                    counts.cancelled.fetch_add(1, Ordering::Relaxed);
                }
            },
            // The caller gives up while the release is out.
            7 => match locker.acquire(NAME, &o).await {
                Ok(lease) => {
                    grants.record(began, &lease);
                    if timeout(rng.ms(0, 3), lease.release()).await.is_err() {
                        counts.cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) => counts.record::<()>(&Err(e)),
            },
            // By hand: acquire, section, release. Nothing cancels this section: if the lease is
            // lost meanwhile, the fence is what protects the store.
            2 => {
                let client = format!("t{id}.manual");
                match locker.acquire(NAME, &o).await {
                    Ok(lease) => {
                        grants.record(began, &lease);
                        section(&store, &client, &lease, pause).await;
                        let token = token_of(&lease);
                        let released = lease.release().await;
                        counts.record(&released);
                        losses.record(Some(token), &released);
                    }
                    Err(e) => counts.record::<()>(&Err(e)),
                }
            }
            // A lease dropped without release: released in the background.
            3 => match locker.acquire(NAME, &o).await {
                Ok(lease) => {
                    grants.record(began, &lease);
                    drop(lease);
                    counts.dropped.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => counts.record::<()>(&Err(e)),
            },
            // The caller gives up mid-body: the future is dropped.
            4 => {
                let client = format!("t{id}.run");
                let give_up = rng.ms(0, 60);
                let mut token = None;
                let call = locker.run(NAME, &o, async |lease| {
                    token = Some(token_of(lease));
                    grants.record(began, lease);
                    section(&store, &client, lease, ms(50)).await
                });
                match timeout(give_up, call).await {
                    Ok(res) => {
                        counts.record(&res);
                        losses.record(token, &res);
                    }
                    Err(_) => {
                        counts.cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // A body that runs past max_exec.
            _ => {
                let client = format!("t{id}.run");
                let o = o.with_max_exec(ms(ttl / 4));
                let mut token = None;
                let res = locker
                    .run(NAME, &o, async |lease| {
                        token = Some(token_of(lease));
                        grants.record(began, lease);
                        section(&store, &client, lease, ms(ttl / 2)).await
                    })
                    .await;
                counts.record(&res);
                losses.record(token, &res);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: SOAK_SECS (default 60) seconds; run with --include-ignored"]
async fn soak_random_faults_no_violations_no_leaks() {
    let rig = Rig::start(NAME, Mode::Fenced, 60).await;
    let baseline = Baseline::take(&rig);
    let records = Records::default();
    let started = Instant::now();
    let until = started + rig.length();
    let injected = {
        let lockers = rig.lockers().await;
        let workers: Vec<_> = (0..16u64)
            .map(|id| {
                let (locker, store) = (lockers[id as usize % 4].clone(), rig.store.clone());
                tokio::spawn(worker(id, rig.seed, locker, store, records.clone(), until))
            })
            .collect();
        let injected = inject(&rig, &lockers[0], NAME, Forcing::Lock, (started, until)).await;
        for w in workers {
            timeout(Duration::from_secs(60), w)
                .await
                .expect("a worker hung after the soak")
                .expect("worker panicked");
        }
        injected
    };
    println!("{} faults: {:?}", injected.faults.len(), injected.faults);
    let counts = &records.counts;
    println!("{counts}");
    baseline.assert_back(&rig).await;

    let report = rig.store.check().await.unwrap();
    println!("{report}");
    print_overlaps(&report, &records, &injected);
    assert_eq!(report.violations(), 0, "safety violations: {report}");
    let losses = &records.losses;
    let unreported = losses.unreported(&injected.forced);
    println!(
        "{} leases force-released under their holders, {} of their calls reported \
         success; {} bodies ran nested sections, {} with two inside at once",
        injected.forced.len(),
        unreported.len(),
        losses.nested_bodies.load(Ordering::Relaxed),
        losses.nested_overlaps.load(Ordering::Relaxed),
    );
    assert!(
        !injected.forced.is_empty(),
        "no lease was force-released under its holder"
    );
    assert!(
        unreported.is_empty(),
        "losses reported as success: {unreported:?}"
    );
    assert!(losses.nested_bodies.load(Ordering::Relaxed) > 0);
    assert_eq!(losses.nested_overlaps.load(Ordering::Relaxed), 0);
    records.assert_fences_in_order();
    // The faults happened and were felt: calls failed, leases were lost, stale writes refused.
    let felt = counts.redis.load(Ordering::Relaxed)
        + counts.lost.load(Ordering::Relaxed)
        + report.refused.len() as u64;
    assert!(felt > 0, "no fault had any effect: {counts}; {report}");
    assert!(
        counts.sections.load(Ordering::Relaxed) > 0,
        "no section ran: {counts}"
    );
    assert!(report.accepted > 0, "no write was accepted: {report}");
    assert_every_key_expires(&rig.server).await;
}

/// Prints the lock soak's overlapping pairs by cause.
fn print_overlaps(report: &Report, records: &Records, injected: &Injected) {
    // Overlaps are expected across the restart: the snapshot it loads does not have the key of
    // the holder at the time of the crash, so new holders get in while that one is still inside
    // its body (until its next renewal); their fences are higher, so the store refuses the old
    // holder's write. Any other overlap of two cancellable (`run`) sections means a body
    // outlived its lease: printed, as the margin is the drift.
    let restart = injected.restart;
    let spans_restart = |h: &Hold| {
        restart.is_some_and(|r| h.start <= r.after && h.end.is_none_or(|e| e >= r.after))
    };
    // So are overlaps with a holder whose key was force-released under it: its body runs on
    // until its next renewal shows the loss, and the store refuses its write.
    let forced_fences = records.losses.forced_fences(&injected.forced);
    let (mut across_restart, mut after_force, mut run_overlaps, mut other_overlaps) = (0, 0, 0, 0);
    for &(a, b) in &report.overlaps {
        let (a, b) = (&report.holds[a], &report.holds[b]);
        if spans_restart(a) || spans_restart(b) {
            across_restart += 1;
        } else if forced_fences.contains(&a.fence) || forced_fences.contains(&b.fence) {
            after_force += 1;
        } else if a.client.ends_with(".run") && b.client.ends_with(".run") {
            run_overlaps += 1;
        } else {
            other_overlaps += 1;
        }
    }
    println!(
        "overlapping pairs: {across_restart} across the restart ({restart:?}), \
         {after_force} after a force-release, {run_overlaps} of two run sections otherwise{}, \
         {other_overlaps} involving a manual lease",
        if run_overlaps > 0 {
            " (A BODY OUTLIVED ITS LEASE)"
        } else {
            ""
        }
    );
}

/// An unsafe control's parts: a lock server, a server for the store, an unfenced store of
/// `name` on it (emptied), and a locker on the lock server.
async fn control(name: &str) -> (RedisServer, RedisServer, FencedStore, Locker) {
    let (server, store_server) = (RedisServer::start(), RedisServer::start());
    let store = FencedStore::connect(&store_server.url(), name)
        .await
        .unwrap();
    store.reset(Mode::Unfenced).await.unwrap();
    let locker = Locker::connect(&server.url()).await.unwrap();
    (server, store_server, store, locker)
}

const PERMITS: u32 = 3;

/// 8 tasks share 3 permits under the lock soak's faults (`SOAK_SECS`, default 5 s): never more
/// than 3 inside at once, apart from holders a fault took a key from, and those are told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_permits_random_faults_at_most_n_inside() {
    let kinds = [Kind::Permit(PERMITS); 8];
    let soak = slots_soak("soak-permits", &kinds, Forcing::Permit(PERMITS), 5).await;
    assert_sound(&soak, PERMITS as usize);
}

/// The unsafe control of the permits soak, with the fault for real: 3 holders inside, one of
/// their permit keys deleted under its holder (as eviction would). A fourth holder gets in while
/// the three are still inside and the checker reports it; the holder whose key went is told at
/// its release, and excusing it, as the soak does, clears the crowd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_control_a_key_deleted_under_its_holder_lets_a_fourth_in() {
    const NAME: &str = "control-permits";
    let (server, _store_server, store, locker) = control(NAME).await;
    // Renewals far apart: nothing notices the deleted key before the holders leave.
    let o = LockOptions::new(ms(30_000))
        .with_permits(PERMITS)
        .with_wait(ms(5_000));
    let (entered, mut inside) = tokio::sync::mpsc::channel(3);
    let (go, gate) = tokio::sync::watch::channel(false);
    let holders: Vec<_> = (0..3)
        .map(|i| {
            let (locker, store, entered, mut gate) =
                (locker.clone(), store.clone(), entered.clone(), gate.clone());
            tokio::spawn(async move {
                let client = format!("h{i}");
                locker
                    .run(NAME, &o, async |lease| {
                        let fence = lease.fence();
                        store
                            .enter_as(&client, fence, HoldMode::Permit(PERMITS))
                            .await
                            .unwrap();
                        entered.send(token_of(lease)).await.unwrap();
                        gate.wait_for(|go| *go).await.unwrap();
                        store.leave(&client, fence).await.unwrap();
                    })
                    .await
            })
        })
        .collect();
    let mut tokens = HashMap::new();
    for _ in 0..3 {
        let got = timeout(Duration::from_secs(10), inside.recv()).await;
        let (token, fence) = got.expect("three holders inside").unwrap();
        tokens.insert(token, fence);
    }
    let key = format!("{}:permit:0", locker.key_of(NAME));
    let token = rig::delete_held(&server.url(), &key)
        .await
        .expect("permit 0 held");
    let victim = tokens[&token];
    let fourth = locker
        .run(NAME, &o, async |lease| {
            store
                .enter_as("h3", lease.fence(), HoldMode::Permit(PERMITS))
                .await
                .unwrap();
            store.leave("h3", lease.fence()).await.unwrap();
        })
        .await;
    fourth.expect("the deleted key's permit");
    go.send(true).unwrap();
    let mut lost = 0;
    for h in holders {
        let res = timeout(Duration::from_secs(10), h)
            .await
            .expect("holder ends")
            .unwrap();
        lost += usize::from(matches!(res, Err(LockError::Lost { .. })));
    }
    assert_eq!(
        lost, 1,
        "the holder whose key went is told, the others are not"
    );
    let mut report = store.check().await.unwrap();
    println!("{report}");
    assert_eq!(
        (report.violations(), report.most_inside),
        (1, 4),
        "{report}"
    );
    assert_eq!(report.crowds[0].inside.len(), 4, "{report}");
    report.excuse(|h| h.fence == victim);
    assert_eq!((report.violations(), report.excused), (0, 1), "{report}");
}

/// 6 shared and 2 exclusive tasks on one read-write lock under the lock soak's faults
/// (`SOAK_SECS`, default 5 s): no exclusive holder inside with anyone else, apart from holders a
/// fault took the key from, and those are told; shared holders were inside together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_read_write_random_faults_no_exclusive_with_others() {
    let mut kinds = [Kind::Shared; 8];
    kinds[..2].fill(Kind::Exclusive);
    let soak = slots_soak("soak-rw", &kinds, Forcing::ReadWrite, 5).await;
    // Two shared holders inside together at least once.
    assert_sound(&soak, 2);
}

/// The unsafe control of the read-write soak, with the fault for real: two shared holders
/// inside, the lock's key deleted under them (as eviction would). An exclusive caller gets in
/// while they are inside and the checker reports it; both shared holders are told at their
/// release, and excusing them clears the crowds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_control_a_key_deleted_under_shared_holders_lets_a_writer_in() {
    const NAME: &str = "control-rw";
    let (server, _store_server, store, locker) = control(NAME).await;
    let o = LockOptions::new(ms(30_000)).with_wait(ms(5_000));
    let (entered, mut inside) = tokio::sync::mpsc::channel(2);
    let (go, gate) = tokio::sync::watch::channel(false);
    let readers: Vec<_> = (0..2)
        .map(|i| {
            let (locker, store, entered, mut gate) =
                (locker.clone(), store.clone(), entered.clone(), gate.clone());
            tokio::spawn(async move {
                let client = format!("r{i}");
                let shared = o.with_shared(true);
                locker
                    .run(NAME, &shared, async |lease| {
                        let fence = lease.fence();
                        let mode = HoldMode::Shared;
                        store.enter_as(&client, fence, mode).await.unwrap();
                        entered.send(lease.fence()).await.unwrap();
                        gate.wait_for(|go| *go).await.unwrap();
                        store.leave(&client, fence).await.unwrap();
                    })
                    .await
            })
        })
        .collect();
    for _ in 0..2 {
        let got = timeout(Duration::from_secs(10), inside.recv()).await;
        got.expect("two shared holders inside").unwrap();
    }
    let rig::Taken::Holders(tokens) =
        rig::delete_holders(&server.url(), &locker.key_of(NAME), 0).await
    else {
        panic!("a shared hold's key holds no permits mark");
    };
    assert_eq!(tokens.len(), 2, "both shared holders' key deleted");
    let writer = locker
        .run(NAME, &o, async |lease| {
            let mode = HoldMode::Exclusive;
            store.enter_as("w", lease.fence(), mode).await.unwrap();
            store.leave("w", lease.fence()).await.unwrap();
        })
        .await;
    writer.expect("the deleted key");
    go.send(true).unwrap();
    for r in readers {
        let res = timeout(Duration::from_secs(10), r).await;
        let res = res.expect("reader ends").unwrap();
        assert!(matches!(res, Err(LockError::Lost { .. })), "{res:?}");
    }
    let mut report = store.check().await.unwrap();
    println!("{report}");
    assert!(report.violations() > 0, "{report}");
    report.excuse(|h| h.mode == HoldMode::Shared);
    assert_eq!(report.violations(), 0, "{report}");
}

/// Workers of every mode on one name under the lock soak's faults (`SOAK_SECS`, default 8 s): 2
/// exclusive, 2 shared, 3 with `permits = 3` and 2 with `permits = 2` (`permits = 1` is the
/// exclusive mode: one code path). Never two holds inside at once whose modes exclude each
/// other (an exclusive hold with any other, a shared hold with a permit, permits of 3 with
/// permits of 2, more than N permits of N), apart from holders a fault took the key from, and
/// those are told. A caller whose mode or N disagrees with the holders' is refused with
/// `Config`: counted and printed, not a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_mixed_modes_random_faults_no_incompatible_holders_inside() {
    use Kind::{Exclusive, Permit, Shared};
    let kinds = [
        Exclusive,
        Exclusive,
        Shared,
        Shared,
        Permit(3),
        Permit(3),
        Permit(3),
        Permit(2),
        Permit(2),
    ];
    let soak = slots_soak("soak-mixed", &kinds, Forcing::Mixed(3), 8).await;
    // Two holders of a mode that shares the name inside together at least once.
    assert_sound(&soak, 2);
}

/// The unsafe control of the mixed-mode soak: two holders of `permits = 3` inside, by the lock,
/// while sections of the other modes run without taking it (as a caller that skipped the lock
/// would): an exclusive one, a shared one and one of `permits = 2`, one after the other. The
/// checker reports each of them as a crowd with the two permit holders; excusing the three
/// leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_control_sections_of_other_modes_without_the_lock_are_crowds() {
    const NAME: &str = "control-mixed";
    let (server, _store_server, store, locker) = control(NAME).await;
    let o = LockOptions::new(ms(30_000)).with_permits(PERMITS);
    let (entered, mut inside) = tokio::sync::mpsc::channel(2);
    let (go, gate) = tokio::sync::watch::channel(false);
    let holders: Vec<_> = (0..2)
        .map(|i| {
            let (locker, store, entered, mut gate) =
                (locker.clone(), store.clone(), entered.clone(), gate.clone());
            tokio::spawn(async move {
                let client = format!("p{i}");
                locker
                    .run(NAME, &o, async |lease| {
                        let (fence, mode) = (lease.fence(), HoldMode::Permit(PERMITS));
                        store.enter_as(&client, fence, mode).await.unwrap();
                        entered.send(()).await.unwrap();
                        gate.wait_for(|go| *go).await.unwrap();
                        store.leave(&client, fence).await.unwrap();
                    })
                    .await
            })
        })
        .collect();
    for _ in 0..2 {
        let got = timeout(Duration::from_secs(10), inside.recv()).await;
        got.expect("two permit holders inside").unwrap();
    }
    // No lease, so no fence: the sections make up their own.
    let intruders = [
        ("x", HoldMode::Exclusive),
        ("s", HoldMode::Shared),
        ("p2", HoldMode::Permit(2)),
    ];
    for (fence, (client, mode)) in (1..).zip(intruders) {
        store.enter_as(client, fence, mode).await.unwrap();
        store.leave(client, fence).await.unwrap();
    }
    go.send(true).unwrap();
    for h in holders {
        let res = timeout(Duration::from_secs(10), h).await;
        res.expect("holder ends")
            .unwrap()
            .expect("the permit holds");
    }
    let mut report = store.check().await.unwrap();
    println!("{report}");
    assert_eq!(report.violations(), 3, "{report}");
    for (crowd, (client, _)) in report.crowds.iter().zip(intruders) {
        let mut inside: Vec<&str> = crowd
            .inside
            .iter()
            .map(|&i| &*report.holds[i].client)
            .collect();
        inside.sort_unstable();
        let mut expected = vec!["p0", "p1", client];
        expected.sort_unstable();
        assert_eq!(inside, expected, "{report}");
    }
    report.excuse(|h| intruders.iter().any(|(client, _)| h.client == *client));
    assert_eq!((report.violations(), report.excused), (0, 3), "{report}");
    assert_every_key_expires(&server).await;
}

/// A read-write lock whose shared holders crash (`soak/crashes.rs`, `SOAK_SECS`, default 5 s):
/// shared holder processes with a lease of 300 ms, two at a time, each killed with SIGKILL
/// 50-400 ms after it has the lock, beside 3 shared holders with a lease of 3 s and 2 writers in
/// this process. A dead holder keeps the writers out for its lease at most: every writer has the
/// lock within 600 ms of the later of the last release of a live holder before it and the end
/// of the last killed holder's lease; and some writer did wait for a killed holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_read_write_killed_shared_holders_keep_writers_out_for_their_lease_at_most() {
    crashes::crash_soak("soak-rw-crash", 5).await.assert_sound();
}

/// The crash soak's judge of a writer's wait, on timelines written by hand: the name comes free
/// at the last release of a live hold that began before the writer had the lock, or at the end
/// of the lease of the last holder killed before then, whichever is later (never before the
/// writer's start); a writer is late past that and the margin.
#[test]
fn a_writer_wait_is_judged_by_live_releases_and_dead_leases() {
    use crashes::{DEAD_LEASE, LiveHold, MARGIN, Wait, judge};
    let t0 = Instant::now();
    let at = |n: u64| t0 + ms(n);
    let wait = |start, end| Wait {
        writer: 0,
        start: at(start),
        end: at(end),
        got: true,
    };
    let holds = [
        LiveHold {
            got: at(0),
            released: at(100),
        },
        // Began after the writer had the lock: not what it waited for.
        LiveHold {
            got: at(5_000),
            released: at(5_050),
        },
    ];
    // Waiting for a live holder: free at its release.
    let live = judge(wait(50, 120), &holds, &[], DEAD_LEASE);
    assert_eq!(
        (live.free, live.by_dead, live.late()),
        (at(100), false, ms(0))
    );
    // A holder killed at 200 ms: free at 500 ms; in time up to 500 ms + the margin.
    let crash = [at(200)];
    let dead = judge(wait(150, 900), &holds, &crash, DEAD_LEASE);
    assert_eq!(
        (dead.free, dead.by_dead, dead.late()),
        (at(500), true, ms(0))
    );
    let late = judge(wait(150, 3_000), &holds, &crash, DEAD_LEASE);
    assert_eq!(late.late(), ms(3_000) - ms(500) - MARGIN);
    // A crash long before the writer began does not excuse its wait.
    let after = judge(wait(2_000, 2_800), &holds, &crash, DEAD_LEASE);
    assert_eq!((after.free, after.by_dead), (at(2_000), false));
    assert_eq!(after.late(), ms(800) - MARGIN);
}

/// Leases of 1 s over slow links (`soak/slow.rs`, `SOAK_SECS`, default 8 s): 24 tasks on 12 names
/// hold them through the two proxies, whose delays go through 0 to 300 ms each way, in fenced
/// sections of 300-900 ms. No lease is told `Lost` while the server still holds its key (read
/// straight from the server at that moment), apart from losses a stall of this process
/// explains and those of leases taken as a link slowed down; leases were renewed over the
/// slowest links; no safety violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_slow_links_no_lease_told_lost_while_the_server_holds_its_key() {
    slow::slow_soak("soak-slow", 8).await.assert_sound();
}
