//! A soak: 16 tasks on 4 lockers (one straight to Redis, three through fault proxies) run mixed
//! locked sections on one name for `SOAK_SECS` seconds (default 60) while random faults hit:
//! proxy delays, blackholes and resets, Redis frozen, leases force-released under their holders,
//! callers dropped at random points of acquire, wait, body and release, and one Redis crash
//! (`kill -9`) and restart that loads an older snapshot (taken a third of the way in). Then: 0
//! safety violations in the fenced store's history; fences grow in real-time order across
//! everything, the restart included; no call whose lease was force-released reports success;
//! nested sections joined in one body never run at once; and once every locker is dropped, the
//! runtime's task count and Redis's client list are back to their baseline.
//!
//! `#[ignore]`d: run it with `cargo test --test soak -- --include-ignored` (the README's test
//! command and `.ci/run` do). `SOAK_SEED` replays a run (the seed is printed).

pub mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_runtime::{Lease, LockError, LockOptions, Locker};
use lock_testing::{FaultProxy, RedisServer};
use support::fenced::FencedStore;
use support::history::{Hold, Mode};
use support::{Rng, eventually, ms, query, raw_connection};
use tokio::time::{Instant, timeout};

/// Outcomes of the operations, by kind.
#[derive(Default)]
struct Counts {
    sections: AtomicU64,
    busy: AtomicU64,
    lost: AtomicU64,
    max_exec: AtomicU64,
    redis: AtomicU64,
    cancelled: AtomicU64,
    dropped: AtomicU64,
    other: AtomicU64,
}

impl Counts {
    fn record<T>(&self, res: &Result<T, LockError>) {
        let counter = match res {
            Ok(_) => &self.sections,
            Err(LockError::Busy { .. }) => &self.busy,
            Err(LockError::Lost { .. }) => &self.lost,
            Err(LockError::MaxExecExceeded { .. }) => &self.max_exec,
            Err(LockError::Redis { .. }) => &self.redis,
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
            "{} sections done, {} busy, {} lost, {} max_exec, {} redis errors, {} cancelled by the caller, \
             {} leases dropped unreleased, {} other errors",
            g(&self.sections),
            g(&self.busy),
            g(&self.lost),
            g(&self.max_exec),
            g(&self.redis),
            g(&self.cancelled),
            g(&self.dropped),
            g(&self.other)
        )
    }
}

const NAME: &str = "soak";

/// What the loss checks need: the leases an operator force-released (by token) while their
/// holders held them, the results their holders' calls reported, and nested sections seen
/// inside one body at once.
#[derive(Default)]
struct Losses {
    forced: std::sync::Mutex<std::collections::HashSet<String>>,
    /// `((token, fence), the call returned success)` for each call that held a lease.
    results: std::sync::Mutex<Vec<((String, u64), bool)>>,
    nested_bodies: AtomicU64,
    nested_overlaps: AtomicU64,
}

impl Losses {
    fn record<T>(&self, token: Option<(String, u64)>, res: &Result<T, LockError>) {
        if let Some(token) = token {
            self.results.lock().unwrap().push((token, res.is_ok()));
        }
    }

    /// Calls that reported success although their lease was force-released under them.
    fn unreported(&self) -> Vec<String> {
        let forced = self.forced.lock().unwrap();
        let results = self.results.lock().unwrap();
        results
            .iter()
            .filter(|((token, _), ok)| *ok && forced.contains(token))
            .map(|((token, _), _)| token.clone())
            .collect()
    }

    /// The fences of the leases force-released under their holders.
    fn forced_fences(&self) -> std::collections::HashSet<u64> {
        let forced = self.forced.lock().unwrap();
        let results = self.results.lock().unwrap();
        results
            .iter()
            .filter(|((token, _), _)| forced.contains(token))
            .map(|((_, fence), _)| *fence)
            .collect()
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

/// Every lease handed out: when its call began, when the lease was in hand, and its fence.
#[derive(Default)]
struct Grants(std::sync::Mutex<Vec<(Instant, Instant, u64)>>);

impl Grants {
    fn record(&self, began: Instant, fence: u64) {
        self.0.lock().unwrap().push((began, Instant::now(), fence));
    }

    /// Pairs where a lease handed out entirely after another one has a fence that is not above
    /// it: `(earlier fence, later fence)`.
    fn backwards(&self) -> Vec<(u64, u64)> {
        let mut grants = self.0.lock().unwrap().clone();
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
        self.0.lock().unwrap().len()
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
struct Records {
    counts: Arc<Counts>,
    grants: Arc<Grants>,
    losses: Arc<Losses>,
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
                        grants.record(began, lease.fence());
                        section(&store, &client, lease, pause).await
                    })
                    .await;
                counts.record(&res);
                losses.record(token, &res);
            }
            // Nested sections on the same name, joined inside one locked body.
            8 => {
                let o = o.without_fence();
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
                    grants.record(began, lease.fence());
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
                    grants.record(began, lease.fence());
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
                        grants.record(began, lease.fence());
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
                    grants.record(began, lease.fence());
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
                    grants.record(began, lease.fence());
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
                        grants.record(began, lease.fence());
                        section(&store, &client, lease, ms(ttl / 2)).await
                    })
                    .await;
                counts.record(&res);
                losses.record(token, &res);
            }
        }
    }
}

/// Connections to `url` other than the one asking (blocking: no task of the runtime is used).
fn other_clients(url: &str) -> usize {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut conn).unwrap();
    list.lines().filter(|l| !l.trim().is_empty()).count() - 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: SOAK_SECS (default 60) seconds; run with --include-ignored"]
async fn soak_random_faults_no_violations_no_leaks() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("soak: {secs} s, SOAK_SEED={seed}");
    let server = RedisServer::start();
    let store_server = RedisServer::start();
    let store = FencedStore::connect(&store_server.url(), NAME)
        .await
        .unwrap();
    store.reset(Mode::Fenced).await.unwrap();
    let proxies = [
        FaultProxy::start(server.addr()).await,
        FaultProxy::start(server.addr()).await,
    ];

    let metrics = tokio::runtime::Handle::current().metrics();
    let base_tasks = metrics.num_alive_tasks();
    let base_clients = tokio::task::block_in_place(|| other_clients(&server.url()));

    let counts = Arc::new(Counts::default());
    let grants = Arc::new(Grants::default());
    let losses = Arc::new(Losses::default());
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let mut faults = Vec::new();
    // The store's sequence number right after the Redis restart.
    let mut restart_seq = None;
    {
        let quick = |url: String| {
            Locker::builder()
                .url(url)
                .response_timeout(ms(300))
                .connect()
        };
        let lockers = [
            Locker::connect(&server.url()).await.unwrap(),
            Locker::connect(&proxies[0].url()).await.unwrap(),
            Locker::connect(&proxies[1].url()).await.unwrap(),
            quick(proxies[0].url()).await.unwrap(),
        ];
        let workers: Vec<_> = (0..16u64)
            .map(|id| {
                let records = Records {
                    counts: counts.clone(),
                    grants: grants.clone(),
                    losses: losses.clone(),
                };
                let (locker, store) = (lockers[id as usize % 4].clone(), store.clone());
                tokio::spawn(worker(id, seed, locker, store, records, until))
            })
            .collect();

        // The fault injector, in this task: the servers and proxies stay owned here.
        let mut rng = Rng::new(seed);
        let save_at = started + Duration::from_secs(secs) / 3;
        let restart_at = started + Duration::from_secs(secs) * 2 / 3;
        let (mut saved, mut restarted) = (false, false);
        while Instant::now() < until {
            tokio::time::sleep(rng.ms(100, 600)).await;
            let proxy = &proxies[rng.below(2) as usize];
            let lasting = rng.ms(50, 700);
            let fault = if !saved && Instant::now() >= save_at {
                8
            } else if !restarted && Instant::now() >= restart_at {
                9
            } else {
                rng.below(6)
            };
            match fault {
                0 => {
                    let d = rng.ms(5, 80);
                    faults.push(format!("delay {d:?} for {lasting:?}"));
                    proxy.delay(d);
                    tokio::time::sleep(lasting).await;
                    proxy.pass();
                }
                1 => {
                    faults.push(format!("blackhole for {lasting:?}"));
                    proxy.blackhole();
                    tokio::time::sleep(lasting).await;
                    proxy.pass();
                }
                2 => {
                    faults.push("reset".to_owned());
                    proxy.reset_all();
                }
                3 => {
                    let lasting = rng.ms(50, 500);
                    faults.push(format!("redis frozen for {lasting:?}"));
                    tokio::task::block_in_place(|| server.pause());
                    tokio::time::sleep(lasting).await;
                    tokio::task::block_in_place(|| server.resume());
                }
                4 => {
                    faults.push(format!("delay+reset {lasting:?}"));
                    proxy.delay(rng.ms(5, 50));
                    tokio::time::sleep(lasting).await;
                    proxy.reset_all();
                    proxy.pass();
                }
                5 => {
                    // An operator's force-release under a live holder (as eviction or a
                    // failover would take the key): its call must not report success.
                    let forced = match lockers[0].inspect(NAME).await {
                        Ok(Some(info)) => match (info.holder, info.state) {
                            (Some(holder), lock_runtime::LockState::Held) => {
                                match lockers[0].force_release(NAME, &info.value).await {
                                    Ok(true) => Some(holder.token),
                                    _ => None,
                                }
                            }
                            _ => None,
                        },
                        _ => None,
                    };
                    faults.push(format!("force-release: {}", forced.is_some()));
                    losses.forced.lock().unwrap().extend(forced);
                }
                8 => {
                    faults.push("snapshot saved".to_owned());
                    let raw = raw_connection(&server.url()).await;
                    let () = query(&raw, &redis::cmd("SAVE")).await;
                    saved = true;
                }
                _ => {
                    let fence_key = format!("{}:fence", lockers[0].key_of(NAME));
                    let handed_out = grants.0.lock().unwrap().iter().map(|g| g.2).max();
                    tokio::task::block_in_place(|| {
                        server.kill();
                        server.restart();
                    });
                    // The restart loaded the older snapshot: the counter came back behind.
                    let raw = raw_connection(&server.url()).await;
                    let counter: Option<u64> = query(&raw, redis::cmd("GET").arg(&fence_key)).await;
                    faults.push(format!(
                        "redis killed and restarted from the snapshot (fence counter {counter:?}, \
                         {handed_out:?} handed out before)"
                    ));
                    restarted = true;
                    restart_seq = Some(store.seq().await.unwrap());
                }
            }
        }
        for p in &proxies {
            p.pass();
        }
        for w in workers {
            timeout(Duration::from_secs(60), w)
                .await
                .expect("a worker hung after the soak")
                .expect("worker panicked");
        }
        drop(lockers);
    }
    println!("{} faults: {faults:?}", faults.len());
    println!("{counts}");

    // No leaks: every task the lockers started ends, every connection they opened closes.
    eventually(
        Duration::from_secs(10),
        "the runtime's task count back to its baseline",
        || async { metrics.num_alive_tasks() <= base_tasks },
    )
    .await;
    let url = server.url();
    eventually(
        Duration::from_secs(10),
        "Redis's client list back to its baseline",
        || async { tokio::task::block_in_place(|| other_clients(&url)) <= base_clients },
    )
    .await;

    let report = store.check().await.unwrap();
    println!("{report}");
    // Overlaps are expected across the restart: the snapshot it loads does not have the key of
    // the holder at the time of the crash, so new holders get in while that one is still inside
    // its body (until its next renewal); their fences are higher, so the store refuses the old
    // holder's write. Any other overlap of two cancellable
    // (`run`) sections means a body outlived its lease: printed, as the margin is the drift.
    let spans_restart =
        |h: &Hold| restart_seq.is_some_and(|r| h.start <= r && h.end.is_none_or(|e| e >= r));
    // So are overlaps with a holder whose key was force-released under it: its body runs on
    // until its next renewal shows the loss, and the store refuses its write.
    let forced_fences = losses.forced_fences();
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
        "overlapping pairs: {across_restart} across the restart (store seq {restart_seq:?}), \
         {after_force} after a force-release, {run_overlaps} of two run sections otherwise{}, \
         {other_overlaps} involving a manual lease",
        if run_overlaps > 0 {
            " (A BODY OUTLIVED ITS LEASE)"
        } else {
            ""
        }
    );
    assert_eq!(report.violations(), 0, "safety violations: {report}");
    let forced = losses.forced.lock().unwrap().len();
    let unreported = losses.unreported();
    println!(
        "{forced} leases force-released under their holders, {} of their calls reported \
         success; {} bodies ran nested sections, {} with two inside at once",
        unreported.len(),
        losses.nested_bodies.load(Ordering::Relaxed),
        losses.nested_overlaps.load(Ordering::Relaxed),
    );
    assert!(forced > 0, "no lease was force-released under its holder");
    assert!(
        unreported.is_empty(),
        "losses reported as success: {unreported:?}"
    );
    assert!(losses.nested_bodies.load(Ordering::Relaxed) > 0);
    assert_eq!(losses.nested_overlaps.load(Ordering::Relaxed), 0);
    let backwards = grants.backwards();
    println!(
        "{} leases handed out; fences in real-time order: {} out of order",
        grants.len(),
        backwards.len()
    );
    assert!(
        backwards.is_empty(),
        "a lease got a fence not above one handed out before it began: {:?}",
        &backwards[..backwards.len().min(5)]
    );
    // The faults happened and were felt: calls failed, leases were lost, stale writes refused.
    let felt = counts.redis.load(Ordering::Relaxed)
        + counts.lost.load(Ordering::Relaxed)
        + report.refused.len() as u64;
    assert!(
        !faults.is_empty() && felt > 0,
        "no fault had any effect: {counts}; {report}"
    );
    assert!(
        counts.sections.load(Ordering::Relaxed) > 0,
        "no section ran: {counts}"
    );
    assert!(report.accepted > 0, "no write was accepted: {report}");
}
