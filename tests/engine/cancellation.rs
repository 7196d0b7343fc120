//! Callers dropped at random points of acquire, wait, body and release, through a link with a
//! real round trip. A checker samples the lock keys all along and asserts that no key outlives
//! its holder: a key whose value belongs to no live lease must be gone within a few round trips,
//! never left for its ttl.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{Lease, LockOptions, Locker};
use lock_testing::{FaultProxy, RedisServer};
use support::{Rng, cycle, eventually, ms, query, raw_connection};
use tokio::time::{Instant, sleep, timeout};

const NAMES: [&str; 3] = ["c0", "c1", "c2"];
/// Each way through the proxy.
const DELAY: Duration = Duration::from_millis(10);
/// How long a key may belong to nobody: the reply or the cleanup of the request that set it is
/// at most a round trip (20 ms) behind; the rest is slack for 2 loaded cores.
const BOUND: Duration = Duration::from_millis(300);
/// Long, so that a leaked key would be seen for seconds.
const TTL: Duration = Duration::from_secs(10);

/// Tokens of the leases the workers hold right now.
#[derive(Default)]
struct Live(Mutex<HashSet<String>>);

impl Live {
    fn add(&self, token: &str) {
        self.0.lock().unwrap().insert(token.to_owned());
    }
    fn remove(&self, token: &str) {
        self.0.lock().unwrap().remove(token);
    }
    fn contains(&self, token: &str) -> bool {
        self.0.lock().unwrap().contains(token)
    }
}

/// Where the callers were dropped, by kind.
#[derive(Default)]
struct Drops {
    acquire: AtomicU64,
    wait: AtomicU64,
    body: AtomicU64,
    release: AtomicU64,
    lease: AtomicU64,
    completed: AtomicU64,
}

impl Drops {
    /// Each count, named: the stages a caller was dropped in first, then the leases dropped and
    /// the sections completed.
    fn counts(&self) -> [(&'static str, u64); 6] {
        let counters = [
            ("acquire", &self.acquire),
            ("wait", &self.wait),
            ("body", &self.body),
            ("release", &self.release),
            ("leases dropped", &self.lease),
            ("completed", &self.completed),
        ];
        counters.map(|(what, n)| (what, n.load(Ordering::Relaxed)))
    }
}

/// The lease of `name`, unless the caller gives up after `cut` (counted in `dropped`) or the
/// acquire fails.
async fn acquire_within(
    locker: &Locker,
    name: &str,
    o: &LockOptions,
    cut: Duration,
    dropped: &AtomicU64,
) -> Option<Lease> {
    match timeout(cut, locker.acquire(name, o)).await {
        Ok(acquired) => acquired.ok(),
        Err(_) => {
            dropped.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

async fn worker(id: u64, locker: Locker, live: Arc<Live>, drops: Arc<Drops>, until: Instant) {
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15 ^ ((id + 1) * 7919));
    let o = LockOptions::new(TTL);
    while Instant::now() < until {
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        // 0 to 3 round trips.
        let cut = ms(rng.below(60));
        match rng.below(5) {
            // Dropped while the acquire request (or its reply) is out.
            0 => {
                if let Some(lease) = acquire_within(&locker, name, &o, cut, &drops.acquire).await {
                    live.add(lease.token());
                    sleep(ms(rng.below(10))).await;
                    live.remove(lease.token());
                    let _ = lease.release().await;
                    drops.completed.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Dropped while waiting for a busy lock (subscribing, queued, retrying).
            1 => {
                let o = o.with_wait(ms(2_000));
                let cut = cut + ms(20);
                if let Some(lease) = acquire_within(&locker, name, &o, cut, &drops.wait).await {
                    live.add(lease.token());
                    live.remove(lease.token());
                    drop(lease);
                    drops.lease.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Dropped in the body of a run.
            2 => {
                let o = o.with_wait(ms(200));
                let entered = AtomicBool::new(false);
                let call = locker.run(name, &o, async |lease| {
                    live.add(lease.token());
                    entered.store(true, Ordering::SeqCst);
                    let guard = Unregister(&live, lease.token().to_owned());
                    sleep(ms(30)).await;
                    drop(guard);
                });
                if timeout(cut, call).await.is_err() && entered.load(Ordering::SeqCst) {
                    drops.body.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Dropped while the release is out.
            3 => {
                if let Ok(lease) = locker.acquire(name, &o).await {
                    live.add(lease.token());
                    live.remove(lease.token());
                    if timeout(cut / 2, lease.release()).await.is_err() {
                        drops.release.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // A lease simply dropped.
            _ => {
                if let Ok(lease) = locker.acquire(name, &o).await {
                    live.add(lease.token());
                    sleep(ms(rng.below(5))).await;
                    live.remove(lease.token());
                    drop(lease);
                    drops.lease.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Takes a token out of the live set when the body ends, also when it is dropped mid-way.
struct Unregister<'a>(&'a Live, String);

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.0.remove(&self.1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_dropped_anywhere_leave_no_key_behind() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::connect(&proxy.url()).await.unwrap());
    }
    // Scripts loaded before the delay.
    for locker in &lockers {
        cycle(locker, "warm", &LockOptions::new(ms(100))).await;
    }
    proxy.delay(DELAY);
    let live = Arc::new(Live::default());
    let drops = Arc::new(Drops::default());
    let until = Instant::now() + ms(8_000);
    let workers: Vec<_> = (0..9u64)
        .map(|id| {
            let (locker, live, drops) = (
                lockers[id as usize % 3].clone(),
                live.clone(),
                drops.clone(),
            );
            tokio::spawn(worker(id, locker, live, drops, until))
        })
        .collect();

    // The checker: every key whose value no live lease holds must be gone within BOUND.
    let raw = raw_connection(&server.url()).await;
    let keys: Vec<String> = NAMES.iter().map(|n| lockers[0].key_of(n)).collect();
    let mut orphans: HashMap<String, Instant> = HashMap::new();
    let (mut samples, mut orphans_seen, mut worst) = (0u64, 0u64, Duration::ZERO);
    let mut leaked = Vec::new();
    while Instant::now() < until + ms(500) {
        let values: Vec<Option<String>> = query(&raw, redis::cmd("MGET").arg(&keys)).await;
        let now = Instant::now();
        samples += 1;
        let mut current = HashSet::new();
        for value in values.into_iter().flatten() {
            // A waiter queued behind a holder marks its value in place (`;w=0` becomes `;w=1`):
            // still the holder's.
            let holder = match value.strip_suffix(";w=1") {
                Some(unmarked) => format!("{unmarked};w=0"),
                None => value.clone(),
            };
            if live.contains(&holder) {
                continue;
            }
            let since = *orphans.entry(value.clone()).or_insert_with(|| {
                orphans_seen += 1;
                now
            });
            worst = worst.max(now - since);
            if now - since > BOUND && !leaked.contains(&value) {
                leaked.push(value.clone());
            }
            current.insert(value);
        }
        orphans.retain(|v, _| current.contains(v));
        sleep(ms(2)).await;
    }
    for w in workers {
        w.await.unwrap();
    }
    let counts = drops.counts();
    println!(
        "dropped in each stage, leases dropped, sections completed: {counts:?}; {samples} \
         samples, {orphans_seen} keys seen without a live holder, longest {worst:?}"
    );
    assert!(
        leaked.is_empty(),
        "{} keys outlived their holder by more than {BOUND:?}: {leaked:?}",
        leaked.len()
    );
    // The faults happened: callers were dropped at every stage, and keys did outlive their
    // caller for a moment (their cleanup was on its way).
    for (stage, n) in &counts[..4] {
        assert!(*n > 0, "no caller was dropped in {stage}");
    }
    assert!(
        orphans_seen > 0,
        "no key was ever seen without a live holder"
    );
    // Nothing is left: no lock key, no queue.
    eventually(ms(2_000), "no lock or queue key left", || async {
        let left: Vec<String> = query(&raw, redis::cmd("KEYS").arg("lock:{c*}")).await;
        let queues: Vec<String> = query(&raw, redis::cmd("KEYS").arg("lock:{c*}:waiters*")).await;
        left.is_empty() && queues.is_empty()
    })
    .await;
}
