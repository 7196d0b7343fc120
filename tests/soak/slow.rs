//! The slow-link soak: leases of 1 s held through the rig's two fault proxies while each proxy's
//! delay goes from 0 to 300 ms each way: a faster link (0 to 250 ms, 1-2 s long) and the
//! slowest (300 ms, a round trip of more than half the lease, 2.5-4 s long: leases are taken,
//! handed over and renewed over it) by turns. A loss is false when the server still held the key for that
//! lease at the moment the lease reported it: its key, read straight from the server (not
//! through a proxy), still held its token with time left. Its renewals got through, only
//! slowly, and nobody else could have had the lock. A loss reported while this process's runtime
//! had stalled (a loaded machine: no renewal could go out in time, whatever the engine) is
//! excused and counted apart, as is one of a lease taken while the link slowed down (see
//! `in_slowdown`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, Locker, LostReason};
use redis::aio::MultiplexedConnection;
use tokio::time::{Instant, timeout};

use super::rig::{Baseline, Rig};
use super::{Counts, section};
use crate::support::fenced::FencedStore;
use crate::support::history::Mode;
use crate::support::{Rng, keys_without_expiry, ms, query, raw_connection};

/// Every lease's length (the ttl; renewed every third of it).
const LEASE: Duration = Duration::from_secs(1);
/// The proxies' delays each way, in ms: of a faster link, of the slowest.
const FAST: [u64; 6] = [0, 50, 100, 150, 200, 250];
const SLOW: u64 = 300;
/// Names and workers: two workers per name, each name's workers on one proxy.
const NAMES: usize = 12;
const WORKERS: usize = 24;
/// The stall monitor ticks every 5 ms; a tick this much later is a stall of the runtime.
const STALL: Duration = Duration::from_millis(30);

/// One proxy's delay from `from` to `to`.
#[derive(Debug, Clone, Copy)]
struct Phase {
    proxy: usize,
    from: Instant,
    to: Instant,
    delay: Duration,
}

/// One hold: through which proxy, from the lease in hand to its loss or the section's end.
#[derive(Debug, Clone, Copy)]
struct Held {
    proxy: usize,
    got: Instant,
    end: Instant,
}

/// A loss a lease reported, with the server's view of its key at that moment.
#[derive(Debug, Clone)]
struct Loss {
    client: String,
    proxy: usize,
    at: Instant,
    reason: LostReason,
    /// The key held the lease's token (as written, or with the waiters' mark set).
    ours: bool,
    /// The key's PTTL then (ms; negative: no key).
    pttl: i64,
    /// The runtime stalled within the lease's length before the loss.
    stalled: bool,
    /// How long the acquire took (a wait, or one round trip), and how long the lease was known
    /// valid when it was in hand (short for a lease handed over by a release: the waiter's
    /// grace).
    acquire: Duration,
    valid_at_start: Duration,
    /// How long it was held before the loss.
    held: Duration,
}

impl Loss {
    fn is_false(&self) -> bool {
        self.ours && self.pttl > 0
    }
}

/// Whether the lease of `loss` was taken while its link was slowing down: its acquire began less
/// than two of the slow link's round trips after the slow phase it was lost in began (or
/// before it). The engine learns a link's round trip from its replies, so until two of them
/// came back it sized the lease's grace and its renewals by the faster link.
fn in_slowdown(loss: &Loss, phases: &[Phase]) -> bool {
    let began = loss.at - loss.held - loss.acquire;
    phases.iter().any(|p| {
        p.proxy == loss.proxy
            && p.delay >= ms(SLOW)
            && p.from <= loss.at
            && loss.at <= p.to
            && began < p.from + 4 * p.delay
    })
}

#[derive(Default)]
struct Timeline {
    phases: Mutex<Vec<Phase>>,
    holds: Mutex<Vec<Held>>,
    losses: Mutex<Vec<Loss>>,
    /// Ticks of the stall monitor that came late: (the tick before, the late one).
    stalls: Mutex<Vec<(Instant, Instant)>>,
    counts: Counts,
}

impl Timeline {
    /// Whether the runtime stalled within a lease's length before `at`.
    fn stalled_before(&self, at: Instant) -> bool {
        let since = at.checked_sub(LEASE).unwrap_or(at);
        let stalls = self.stalls.lock().unwrap();
        stalls.iter().any(|&(from, to)| to > since && from < at)
    }

    /// The delay of `proxy` at `at`.
    fn delay_at(&self, proxy: usize, at: Instant) -> Option<Duration> {
        let phases = self.phases.lock().unwrap();
        let phase = phases
            .iter()
            .rev()
            .find(|p| p.proxy == proxy && p.from <= at);
        phase.map(|p| p.delay)
    }
}

/// What the soak leaves to check.
pub struct SlowSoak {
    timeline: Arc<Timeline>,
    /// Safety violations in the fenced stores of the names, summed, and their reports.
    violations: usize,
    reports: Vec<String>,
    forever: Vec<String>,
}

/// The soak for the rig's length (`SOAK_SECS`, else `default_secs`).
pub async fn slow_soak(name: &'static str, default_secs: u64) -> SlowSoak {
    let rig = Rig::start(name, Mode::Fenced, default_secs).await;
    let baseline = Baseline::take(&rig);
    let timeline = Arc::new(Timeline::default());
    let until = Instant::now() + rig.length();
    let names: Vec<String> = (0..NAMES).map(|i| format!("{name}-{i}")).collect();
    let mut stores = Vec::new();
    for n in &names {
        let store = rig.store.named(n);
        store.reset(Mode::Fenced).await.unwrap();
        stores.push(store);
    }
    let monitor = tokio::spawn(watch_stalls(Arc::clone(&timeline)));
    {
        let raw = raw_connection(&rig.server.url()).await;
        let mut lockers = Vec::new();
        for proxy in &rig.proxies {
            lockers.push(Locker::connect(&proxy.url()).await.unwrap());
        }
        warm_up(&lockers[0]).await;
        let workers: Vec<_> = (0..WORKERS)
            .map(|id| {
                let (n, proxy) = (id % NAMES, id % NAMES % 2);
                let worker = Worker {
                    id,
                    name: names[n].clone(),
                    key: lockers[proxy].key_of(&names[n]),
                    proxy,
                    locker: lockers[proxy].clone(),
                    store: stores[n].clone(),
                    raw: raw.clone(),
                    timeline: Arc::clone(&timeline),
                };
                tokio::spawn(worker.work(rig.seed, until))
            })
            .collect();
        let mut rng = Rng::new(rig.seed);
        let seeds = [rng.below(u64::MAX), rng.below(u64::MAX)];
        tokio::join!(
            slow_down(&rig, 0, &timeline, seeds[0], until),
            slow_down(&rig, 1, &timeline, seeds[1], until),
        );
        for w in workers {
            let ended = timeout(Duration::from_secs(60), w).await;
            ended.expect("a worker hung").expect("a worker panicked");
        }
    }
    monitor.abort();
    baseline.assert_back(&rig).await;
    let forever = keys_without_expiry(&rig.server.url()).await;
    let (mut violations, mut reports) = (0, Vec::new());
    for (n, store) in names.iter().zip(&stores) {
        let report = store.check().await.unwrap();
        violations += report.violations();
        reports.push(format!("{n}: {report}"));
    }
    SlowSoak {
        timeline,
        violations,
        reports,
        forever,
    }
}

/// One lease held until a renewal is confirmed, then released, before the links slow down: the
/// server then has the renewal's and the release's scripts, as one that has served a while
/// does. (On a new server the first renewal also loads its script: three round trips, which a
/// 1 s lease cannot wait for over a round trip of 400 ms or more.)
async fn warm_up(locker: &Locker) {
    let lease = locker
        .acquire("warm-up", &LockOptions::new(LEASE))
        .await
        .unwrap();
    let first = lease.deadline();
    crate::support::eventually(ms(5_000), "a renewal confirmed", || async {
        lease.deadline() > first
    })
    .await;
    lease.release().await.unwrap();
}

/// Records the runtime's stalls (see [`STALL`]) until aborted.
async fn watch_stalls(timeline: Arc<Timeline>) {
    let tick = ms(5);
    let mut last = Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let now = Instant::now();
        if now - last > tick + STALL {
            timeline.stalls.lock().unwrap().push((last, now));
        }
        last = now;
    }
}

/// Sets proxy `proxy`'s delay to a fast link's and a slow one's by turns (see the module's
/// documentation) until `until`; then lets it pass.
async fn slow_down(rig: &Rig, proxy: usize, timeline: &Timeline, seed: u64, until: Instant) {
    let mut rng = Rng::new(seed);
    let p = &rig.proxies[proxy];
    for slow in [false, true].into_iter().cycle() {
        let from = Instant::now();
        if from >= until {
            break;
        }
        let (delay, lasting) = match slow {
            false => (ms(rng.pick(&FAST)), rng.ms(1_000, 2_000)),
            true => (ms(SLOW), rng.ms(2_500, 4_000)),
        };
        let phase = Phase {
            proxy,
            from,
            to: from + lasting,
            delay,
        };
        timeline.phases.lock().unwrap().push(phase);
        p.delay(delay);
        tokio::time::sleep(lasting).await;
    }
    p.pass();
}

/// A task holding one name through one proxy, again and again.
struct Worker {
    id: usize,
    name: String,
    key: String,
    proxy: usize,
    locker: Locker,
    store: FencedStore,
    /// Straight to the server: how the key stands when a loss is reported.
    raw: MultiplexedConnection,
    timeline: Arc<Timeline>,
}

impl Worker {
    /// Until `until`: takes the lease (waiting up to 3 s), runs a fenced section of 300-900 ms
    /// raced against the lease's loss, and releases it. A loss is judged at once.
    async fn work(self, seed: u64, until: Instant) {
        let mut rng = Rng::new(seed ^ (self.id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let o = LockOptions::new(LEASE).with_wait(ms(3_000));
        let client = format!("t{}", self.id);
        let counts = &self.timeline.counts;
        while Instant::now() < until {
            let pause = rng.ms(300, 900);
            let began = Instant::now();
            let lease = match self.locker.acquire(&self.name, &o).await {
                Ok(lease) => lease,
                Err(e) => {
                    counts.record::<()>(&Err(e));
                    continue;
                }
            };
            let got = Instant::now();
            let valid_at_start = lease.deadline().saturating_duration_since(got);
            let lost = tokio::select! {
                reason = lease.lost() => Some(reason),
                () = section(&self.store, &client, &lease, pause) => None,
            };
            let end = Instant::now();
            let held = Held {
                proxy: self.proxy,
                got,
                end,
            };
            self.timeline.holds.lock().unwrap().push(held);
            match lost {
                Some(reason) => {
                    let (value, pttl) = self.view().await;
                    let token = lease.token();
                    let marked = token.strip_suffix('0').map(|t| format!("{t}1"));
                    let loss = Loss {
                        client: client.clone(),
                        proxy: self.proxy,
                        at: end,
                        reason,
                        ours: value == token || Some(&value) == marked.as_ref(),
                        pttl,
                        stalled: self.timeline.stalled_before(end),
                        acquire: got - began,
                        valid_at_start,
                        held: end - got,
                    };
                    self.timeline.losses.lock().unwrap().push(loss);
                    let name = self.name.clone();
                    counts.record::<()>(&Err(LockError::Lost {
                        name,
                        reason,
                        source: None,
                    }));
                    // Whatever the release finds, the loss was reported.
                    let _ = lease.release().await;
                }
                None => counts.record(&lease.release().await),
            }
        }
    }

    /// The key's value (empty when absent) and PTTL, read at once.
    async fn view(&self) -> (String, i64) {
        const VIEW: &str = "return {redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1])}";
        query(
            &self.raw,
            redis::cmd("EVAL").arg(VIEW).arg(1).arg(&self.key),
        )
        .await
    }
}

impl SlowSoak {
    /// No false loss, apart from those a stall of this process explains (counted); the link was
    /// slow while leases were renewed (some hold lasted a renewal period through the slowest
    /// link); no safety violation; every key the engine left expires.
    pub fn assert_sound(&self) {
        let t = &self.timeline;
        for report in &self.reports {
            println!("{report}");
        }
        let phases = t.phases.lock().unwrap().clone();
        let delays: Vec<u128> = phases.iter().map(|p| p.delay.as_millis()).collect();
        println!("{} delay phases (ms each way): {delays:?}", phases.len());
        println!("{}", t.counts);
        let holds = t.holds.lock().unwrap().clone();
        let renew = LEASE / 3;
        let slow_holds = holds
            .iter()
            .filter(|h| {
                phases.iter().any(|p| {
                    let overlap = h.end.min(p.to).saturating_duration_since(h.got.max(p.from));
                    p.proxy == h.proxy && p.delay >= ms(SLOW) && overlap >= renew
                })
            })
            .count();
        let losses = t.losses.lock().unwrap().clone();
        let (false_losses, excused): (Vec<&Loss>, Vec<&Loss>) = losses
            .iter()
            .filter(|l| l.is_false())
            .partition(|l| !l.stalled);
        // A lease whose acquire began before the link it is renewed over had been slow for two
        // round trips was handed its grace, or first renewed, by what the engine knew of the
        // faster link: counted apart (see `in_slowdown`).
        let (slowdown, false_losses): (Vec<&Loss>, Vec<&Loss>) = false_losses
            .into_iter()
            .partition(|l| in_slowdown(l, &phases));
        let stalls = t.stalls.lock().unwrap().len();
        println!(
            "{} holds, {slow_holds} of them through a renewal period at {:?} each way; {} losses \
             reported: {} false (the server still held the key), {} more while the runtime had \
             stalled ({stalls} stalls of {STALL:?} or more), {} more of leases taken as the link \
             slowed down, {} true",
            holds.len(),
            ms(SLOW),
            losses.len(),
            false_losses.len(),
            excused.len(),
            slowdown.len(),
            losses.len() - false_losses.len() - excused.len() - slowdown.len()
        );
        for l in false_losses.iter().take(5) {
            println!(
                "  false loss: {} ({:?}) with the key still its own, {} ms left; delay {:?} each \
                 way; acquired in {:?}, known valid for {:?} then, held {:?}",
                l.client,
                l.reason,
                l.pttl,
                t.delay_at(l.proxy, l.at),
                l.acquire,
                l.valid_at_start,
                l.held
            );
        }
        assert!(
            false_losses.is_empty(),
            "{} leases told Lost while the server still held their key",
            false_losses.len()
        );
        assert!(slow_holds > 0, "no lease was renewed over a slow link");
        assert_eq!(self.violations, 0, "safety violations");
        assert!(
            self.forever.is_empty(),
            "keys without an expiry after the soak: {}",
            self.forever.join(", ")
        );
    }
}
