//! Redlock on N real, independent redis-servers: the majority rule, node failures while a lease
//! is held, cleanup of partial acquisitions, slow nodes, exclusion and fencing across a node
//! restart. Waiting for a release is a case of `behaviour.rs`, run on every deployment.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockError, Locker, LostReason};
use support::nodes::{Nodes, locker_through};
use support::{
    SleepingBody, acquire_timed, assert_increasing, cycle, cycles, eventually, lost_reason, ms,
    opts, spawn_acquire, timed,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The nodes of `failures` in a `QuorumUnavailable`, by index into `nodes`; panics on a failure
/// that names no node of `nodes` or gives no reason.
fn failed_nodes(nodes: &Nodes, failures: &[(String, String)]) -> Vec<usize> {
    let mut out: Vec<usize> = failures
        .iter()
        .map(|(addr, reason)| {
            assert!(!reason.is_empty(), "no reason given for {addr}");
            (0..nodes.servers.len())
                .find(|&i| nodes.addr(i) == *addr)
                .unwrap_or_else(|| panic!("failure names {addr}, not one of the nodes"))
        })
        .collect();
    out.sort_unstable();
    out
}

/// A locked call of `name` (ttl 1 s, renewed every 100 ms) on a task of its own, for a node
/// fault while it holds the lock: returns once its body runs, with the sender that tells the body
/// the fault happened. The body then holds on for `hold`, runs `then`, and returns how far the
/// lease's deadline moved since the fault, with what `then` returned.
async fn held_through_fault<T, F, Fut>(
    locker: &Locker,
    name: &'static str,
    hold: Duration,
    then: F,
) -> (
    oneshot::Sender<()>,
    JoinHandle<Result<(Duration, T), LockError>>,
)
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send,
{
    let o = opts(1_000).with_renew(ms(100));
    let (started_tx, started_rx) = oneshot::channel();
    let (fault_tx, fault_rx) = oneshot::channel::<()>();
    let locker = locker.clone();
    let run = tokio::spawn(async move {
        locker
            .run(name, &o, async |lease| {
                started_tx.send(()).unwrap();
                fault_rx.await.unwrap();
                let after_fault = lease.deadline();
                tokio::time::sleep(hold).await;
                let out = then().await;
                (lease.deadline().saturating_duration_since(after_fault), out)
            })
            .await
    });
    started_rx.await.unwrap();
    (fault_tx, run)
}

/// For N = 1, 2, 3, 5 and every number k of nodes down, the lock is taken exactly when
/// `N - k >= N/2 + 1`, and a failed attempt leaves no key behind on the nodes that are up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_table_takes_the_lock_exactly_with_a_majority_of_the_configured_nodes() {
    let o = opts(5_000);
    let mut cases = 0;
    for n in [1usize, 2, 3, 5] {
        let nodes = Nodes::start(n);
        let needed = n / 2 + 1;
        for k in 0..=n {
            // Rotate which nodes are down, so that every position is exercised.
            let down: Vec<usize> = (0..k).map(|j| (j + k + n) % n).collect();
            for &i in &down {
                nodes.servers[i].kill();
            }
            // A fresh locker per case: no connection state carried over from a killed server.
            let locker = nodes.locker(ms(500));
            let name = format!("table-{n}-{k}");
            let key = locker.key_of(&name);
            let case = format!("N = {n}, {k} down ({down:?})");
            let res = locker.acquire(&name, &o).await;
            if n - k >= needed {
                let lease = res.unwrap_or_else(|e| panic!("{case}: must be taken: {e}"));
                let holders = nodes.holders(&key).await;
                assert!(holders.len() >= needed, "{case}: key on {holders:?} only");
                lease
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("{case}: release: {e}"));
                // `release` returns once a majority confirmed; the rest follows at once.
                eventually(ms(1_000), &format!("{case}: released everywhere"), || {
                    let (nodes, key) = (&nodes, &key);
                    async move { nodes.holders(key).await.is_empty() }
                })
                .await;
            } else {
                let err = res.expect_err(&format!("{case}: must not be taken"));
                match &err {
                    // One node is the single-node engine: its own error names the server.
                    LockError::Redis { addr, .. } if n == 1 => assert_eq!(*addr, nodes.addr(0)),
                    LockError::QuorumUnavailable {
                        got,
                        needed: want,
                        failures,
                        ..
                    } => {
                        assert_eq!(*want, needed, "{case}");
                        assert!(*got < needed, "{case}: got {got}");
                        let failed = failed_nodes(&nodes, failures);
                        assert!(
                            failed.iter().all(|i| down.contains(i)),
                            "{case}: a node that is up was reported failed: {err}"
                        );
                        // The attempt gives up as soon as a majority is out of reach: by then
                        // more than N - needed nodes have failed.
                        assert!(failed.len() > n - needed, "{case}: {err}");
                        let text = err.to_string();
                        for &i in &failed {
                            assert!(text.contains(&nodes.addr(i)), "{case}: {text}");
                        }
                    }
                    other => panic!("{case}: expected QuorumUnavailable, got {other:?}"),
                }
                // Keys taken on a minority are deleted, not left to expire (ttl 5 s): a node
                // whose grant was still in flight when the attempt gave up is cleaned as soon
                // as its reply lands.
                eventually(
                    ms(1_000),
                    &format!("{case}: no key left on a node that is up"),
                    || {
                        let (nodes, key) = (&nodes, &key);
                        async move { nodes.holders(key).await.is_empty() }
                    },
                )
                .await;
            }
            cases += 1;
            // A restarted node is empty, which is all this test needs.
            for &i in &down {
                nodes.servers[i].restart();
            }
        }
    }
    assert_eq!(cases, 2 + 3 + 4 + 6);
}

/// One of three nodes dies while the lock is held; the other two still form a majority, so the
/// lease keeps renewing and the body runs to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_three_nodes_killed_while_held_the_lease_keeps_renewing() {
    let nodes = Arc::new(Nodes::start(3));
    let locker = nodes.locker(ms(200));
    let key = locker.key_of("hold");
    // 600 ms after the kill, an unrenewed key would have less than 400 ms left.
    let pttls = {
        let (nodes, key) = (nodes.clone(), key.clone());
        move || async move { [nodes.pttl(0, &key).await, nodes.pttl(1, &key).await] }
    };
    let (killed, run) = held_through_fault(&locker, "hold", ms(600), pttls).await;
    nodes.servers[2].kill();
    killed.send(()).unwrap();
    let (advanced, pttls) = run
        .await
        .unwrap()
        .expect("the body completes on a majority");
    assert!(
        advanced >= ms(300),
        "the deadline moved only {advanced:?} in 600 ms after the kill"
    );
    assert!(
        pttls.iter().all(|&p| p > 500),
        "PTTL on the live nodes: {pttls:?}: not renewed"
    );
    assert!(
        nodes.holders(&key).await.is_empty(),
        "released on the live nodes"
    );
}

/// Two of three nodes die while the lock is held; the lease cannot be renewed on a majority any
/// more, so it is lost, because the servers could not be reached, and the body is cancelled
/// before it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_nodes_killed_while_held_the_lease_is_lost_and_the_body_cancelled() {
    let nodes = Nodes::start(3);
    let locker = nodes.locker(ms(200));
    let o = opts(1_000).with_renew(ms(100));
    let (body, _) = SleepingBody::start(&locker, "doomed", o).await;
    nodes.servers[0].kill();
    nodes.servers[2].kill();
    let (res, took) = body.cut_short().await;
    assert_eq!(
        lost_reason(&res),
        Some(LostReason::Unreachable),
        "two of three nodes gone must end the lease: {res:?}"
    );
    // The lease's validity (ttl - drift from the last confirmed renewal) bounds the wait.
    assert!(
        took <= ms(1_000 + 500),
        "loss noticed {took:?} after the kill"
    );
}

/// A minority node that stops answering (a partition, not a refused connection) must not hold
/// up renewal or release: each renewal round is decided by the majority that answers, within the
/// lease's validity, even with a response timeout longer than the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresponsive_minority_node_stalls_neither_renewal_nor_release() {
    let nodes = Nodes::start(3);
    let proxies = nodes.proxies().await;
    let locker = locker_through(&proxies, ms(3_000));
    let key = locker.key_of("partitioned");
    let (cut_tx, run) = held_through_fault(&locker, "partitioned", ms(700), || async {}).await;
    proxies[1].blackhole();
    let cut = Instant::now();
    cut_tx.send(()).unwrap();
    let (advanced, ()) = run
        .await
        .unwrap()
        .expect("a majority still answers: the body completes");
    let took = cut.elapsed();
    assert!(
        advanced >= ms(300),
        "the deadline moved only {advanced:?} in 700 ms"
    );
    // The release returns once the two answering nodes confirmed, not after the 3 s timeout.
    assert!(
        took < ms(2_500),
        "run returned {took:?} after the partition"
    );
    assert_eq!(nodes.get(0, &key).await, None);
    assert_eq!(nodes.get(2, &key).await, None);
    proxies[1].pass();
}

/// Others hold 3 of 5 nodes. The attempt is `Busy`, not `QuorumUnavailable`: every node
/// answered, and the lock is held because someone else has a majority; `wait` applies. The keys
/// it did take on the other two nodes are deleted right away, not left to their ttl: before
/// `acquire` returns on the nodes that had answered, and as soon as the reply lands on a node
/// whose grant was still in flight when the third "busy" decided the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_acquire_is_busy_and_deletes_the_keys_it_took_at_once() {
    let nodes = Nodes::start(5);
    let locker = nodes.locker(ms(500));
    let key = locker.key_of("partial");
    let fence_key = format!("{key}:fence");
    let foreign = [0, 2, 4];
    let ours = [1, 3];
    for i in foreign {
        nodes.set(i, &key, "someone-else", 10_000).await;
    }
    let err = locker.acquire("partial", &opts(10_000)).await.unwrap_err();
    assert!(
        matches!(err, LockError::Busy { .. }),
        "others hold a majority: {err}"
    );

    // Allow a moment for a grant that was still in flight (far below the 10 s ttl).
    eventually(
        ms(500),
        "the keys taken on nodes 1 and 3 are deleted",
        || {
            let (nodes, key) = (&nodes, &key);
            async move { nodes.holders(key).await == foreign }
        },
    )
    .await;
    // Control: the attempt really took the key on those two nodes (the fence counter only
    // moves on a successful SET NX), and never touched the foreign values.
    for i in ours {
        assert!(
            nodes.get(i, &fence_key).await.is_some(),
            "node {i}: no fence counter"
        );
    }
    for i in foreign {
        assert_eq!(nodes.get(i, &fence_key).await, None, "node {i}");
        assert_eq!(
            nodes.get(i, &key).await.as_deref(),
            Some("someone-else"),
            "node {i}"
        );
        assert!(
            nodes.pttl(i, &key).await > 9_000,
            "node {i}: foreign ttl touched"
        );
    }

    // Waiting: the waiter is not woken by the release messages of its own cleanup (that would be
    // a busy loop of attempts for the whole wait); with no release from the holder it retries
    // when the holder's PTTL runs out, which is after the wait.
    for &i in &ours {
        nodes.reset_stats(i).await;
    }
    let (res, took) = timed(locker.acquire("partial", &opts(10_000).with_wait(ms(500)))).await;
    let err = res.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    assert!(took >= ms(500), "gave up after {took:?}");
    for i in ours {
        // Each attempt is one acquire and one cleanup release on a node that granted it.
        let calls = nodes.evalsha_calls(i).await;
        assert!(calls <= 8, "node {i}: {calls} scripts in a 500 ms wait");
    }
    eventually(ms(500), "no key of ours left after waiting", || {
        let (nodes, key) = (&nodes, &key);
        async move { nodes.holders(key).await == foreign }
    })
    .await;
}

/// Replies delayed past the per-node timeout on k of 5 nodes. With k = 2 the three others are a
/// majority; with k = 3 the attempt fails with `QuorumUnavailable` naming the slow nodes and
/// why, and its keys are deleted, not left to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_nodes_past_the_per_node_timeout_count_as_failed() {
    let nodes = Nodes::start(5);
    let proxies = nodes.proxies().await;
    // The per-node timeout is min(response timeout, validity / 10) = 150 ms here; each slow
    // node adds 2 x 200 ms to a round trip.
    let locker = locker_through(&proxies, ms(150));
    let o = opts(10_000);
    let key = locker.key_of("slow");
    let released_everywhere = || {
        let (nodes, key) = (&nodes, &key);
        async move { nodes.holders(key).await.is_empty() }
    };
    // Connect and load the scripts while every node is fast. `release` returns once a majority
    // confirmed; wait for the rest, so that the next attempt does not meet this key.
    cycle(&locker, "slow", &o).await;
    eventually(
        ms(2_000),
        "warm-up released on every node",
        released_everywhere,
    )
    .await;

    for &i in &[0, 1] {
        proxies[i].delay(ms(200));
    }
    let lease = locker
        .acquire("slow", &o)
        .await
        .expect("3 fast nodes of 5 are a majority");
    lease.release().await.unwrap();
    eventually(ms(2_000), "released on every node", released_everywhere).await;

    proxies[2].delay(ms(200));
    let err = locker.acquire("slow", &o).await.unwrap_err();
    let LockError::QuorumUnavailable {
        got,
        needed,
        failures,
        ..
    } = &err
    else {
        panic!("expected QuorumUnavailable, got {err:?}");
    };
    assert_eq!((*got, *needed), (2, 3), "{err}");
    let slow: Vec<String> = [0, 1, 2]
        .iter()
        .map(|&i| proxies[i].addr().to_string())
        .collect();
    let mut named: Vec<String> = failures.iter().map(|(addr, _)| addr.clone()).collect();
    named.sort();
    let mut want = slow.clone();
    want.sort();
    assert_eq!(
        named, want,
        "the failures must be exactly the slow nodes: {err}"
    );
    let text = err.to_string();
    for addr in &slow {
        assert!(text.contains(addr.as_str()), "{text}");
    }
    assert!(
        failures
            .iter()
            .all(|(_, why)| why.contains("timed out") || why.contains("no reply within")),
        "each failure says why: {err}"
    );
    // The keys set on the fast nodes are gone when the call returns; the slow nodes get theirs
    // deleted right after their late SET (same connection, in order), well before the 10 s ttl.
    for i in [3, 4] {
        assert_eq!(nodes.get(i, &key).await, None, "fast node {i}");
    }
    eventually(
        ms(3_000),
        "no key left on the slow nodes",
        released_everywhere,
    )
    .await;
    for p in &proxies {
        p.pass();
    }
}

/// 8 tasks on 3 nodes through two lockers, 300 sections, one node killed and restarted mid-run:
/// no two holders at once, fenced and unfenced callers mixed, and fences that only go up.
///
/// The killed node restarts empty (no persistence). Redlock is only safe then if the node stays
/// out for at least the longest ttl in use (the delayed-restart rule): every key it held has
/// expired elsewhere by then, so it cannot hand a second majority a lock that is still held. The
/// test keeps the node down for longer than the ttl. Fencing survives because every majority
/// meets one of the two nodes that kept their counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_and_monotonic_fences_across_a_node_restart() {
    const TOTAL: usize = 300;
    // Sections past this wait for the restart, so that some run after it.
    const BEFORE_RESTART: usize = 200;
    const TTL_MS: u64 = 2_000;
    let nodes = Arc::new(Nodes::start(3));
    let lockers = [nodes.locker(ms(500)), nodes.locker(ms(500))];
    let o = opts(TTL_MS).with_wait(ms(20_000));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    // Phase of the run: 0 all up, 1 node 2 down, 2 node 2 restarted.
    let (phase, phase_rx) = tokio::sync::watch::channel(0usize);
    let fences = Arc::new(Mutex::new(Vec::<(u64, usize)>::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let locker = lockers[t % 2].clone();
        // Half the tasks cannot read their fence, as `#[distributed_lock]` without `guard`:
        // they take the key with plain commands (fence 0), the others with the script.
        let o = match t % 4 {
            0 | 1 => o,
            _ => lock_runtime::__private::without_fence(o),
        };
        let (inside, overlaps, done, mut phase, fences) = (
            inside.clone(),
            overlaps.clone(),
            done.clone(),
            phase_rx.clone(),
            fences.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while done.load(Ordering::SeqCst) < TOTAL {
                if done.load(Ordering::SeqCst) >= BEFORE_RESTART {
                    phase.wait_for(|&p| p == 2).await.unwrap();
                }
                locker
                    .run("exclusive", &o, async |lease| {
                        if inside.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        let now = *phase.borrow();
                        fences.lock().unwrap().push((lease.fence(), now));
                        tokio::task::yield_now().await;
                        inside.store(false, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                    })
                    .await
                    .unwrap_or_else(|e| panic!("task {t}: {e}"));
            }
        }));
    }
    let at_least = |n: usize| {
        let done = done.clone();
        move || {
            let done = done.clone();
            async move { done.load(Ordering::SeqCst) >= n }
        }
    };
    eventually(ms(10_000), "100 sections before the kill", at_least(100)).await;
    nodes.servers[2].kill();
    phase.send_replace(1);
    let killed_at = done.load(Ordering::SeqCst);
    let down = Instant::now();
    eventually(
        ms(10_000),
        "sections run with node 2 down",
        at_least(killed_at + 20),
    )
    .await;
    // The delayed-restart rule: stay down for at least the longest ttl.
    tokio::time::sleep(ms(TTL_MS + 100).saturating_sub(down.elapsed())).await;
    let restarted = {
        let nodes = nodes.clone();
        tokio::task::spawn_blocking(move || nodes.servers[2].restart())
    };
    restarted.await.unwrap();
    phase.send_replace(2);
    for t in tasks {
        t.await.unwrap();
    }
    println!(
        "{} sections in {:?}",
        done.load(Ordering::SeqCst),
        started.elapsed()
    );

    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders were inside at once"
    );
    let sections = fences.lock().unwrap().clone();
    assert!(sections.len() >= TOTAL);
    let fences: Vec<(u64, usize)> = sections.iter().copied().filter(|f| f.0 != 0).collect();
    let unfenced = sections.len() - fences.len();
    assert!(
        unfenced > 0 && !fences.is_empty(),
        "{unfenced} unfenced sections of {}",
        sections.len()
    );
    for w in fences.windows(2) {
        assert!(
            w[0].0 < w[1].0,
            "fence went from {} to {} (phases {} -> {})",
            w[0].0,
            w[1].0,
            w[0].1,
            w[1].1
        );
    }
    // Control: the fault happened while sections ran, and the restarted node took part again
    // (its fence counter is rebuilt only by grants and raises after the restart).
    let per_phase = |p: usize| sections.iter().filter(|f| f.1 == p).count();
    assert!(
        per_phase(1) >= 20,
        "{} sections with node 2 down",
        per_phase(1)
    );
    assert!(per_phase(2) > 0, "no section after the restart");
    let fence_key = format!("{}:fence", lockers[0].key_of("exclusive"));
    let restarted_fence: Option<u64> = nodes.get(2, &fence_key).await.map(|v| v.parse().unwrap());
    assert!(
        restarted_fence.is_some(),
        "the restarted node never granted the lock again"
    );
    let key = lockers[0].key_of("exclusive");
    eventually(ms(1_000), "released on every node", || {
        let (nodes, key) = (&nodes, &key);
        async move { nodes.holders(key).await.is_empty() }
    })
    .await;
}

/// `min_hold` on Redlock: an early return keeps the key on every node for the rest of
/// `min_hold`, under a value that is no lease's token, then it expires; a second caller is
/// refused meanwhile. A release on Redlock sends every optional argument of the release script
/// (it publishes always), so this also checks that the script reads each from its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_hold_keeps_the_key_on_every_node_after_an_early_return() {
    let nodes = Nodes::start(3);
    let locker = nodes.locker(ms(500));
    let key = locker.key_of("held");
    let o = opts(2_000).with_min_hold(ms(400));
    let lease = locker.acquire("held", &o).await.unwrap();
    let token = lease.token().to_owned();
    lease.release().await.unwrap();
    for i in 0..3 {
        let pttl = nodes.pttl(i, &key).await;
        assert!(
            pttl > 0 && pttl <= 400,
            "node {i}: PTTL {pttl}, not the rest of min_hold"
        );
        assert_eq!(
            nodes.get(i, &key).await,
            Some(format!("{token}:released")),
            "node {i}"
        );
    }
    let err = locker.acquire("held", &opts(2_000)).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    eventually(ms(2_000), "the key expires on every node", || async {
        nodes.holders(&key).await.is_empty()
    })
    .await;
    cycle(&locker, "held", &opts(2_000)).await;
}

/// Within `wait`, an attempt that finds no majority (nodes down) is retried, not returned at
/// once: the waiter gets the lock when the nodes come back; with the majority still down when
/// the wait runs out, the answer is `QuorumUnavailable`. With `wait = 0` it fails at once (see
/// the quorum table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_retries_while_a_majority_is_down() {
    let nodes = Arc::new(Nodes::start(3));
    nodes.servers[0].kill();
    nodes.servers[1].kill();
    let locker = nodes.locker(ms(200));
    let (res, took) = timed(locker.acquire("outage", &opts(2_000).with_wait(ms(300)))).await;
    let err = res.unwrap_err();
    assert!(matches!(err, LockError::QuorumUnavailable { .. }), "{err}");
    assert!(
        took >= ms(300),
        "gave up after {took:?}, before the wait ran out"
    );

    let waiter = spawn_acquire(&locker, "outage", opts(2_000).with_wait(ms(10_000)));
    // Let the waiter meet the outage at least once before the nodes come back.
    let fence_key = format!("{}:fence", locker.key_of("outage"));
    eventually(ms(3_000), "the waiter tried", || {
        let (nodes, fence_key) = (&nodes, &fence_key);
        async move { nodes.get(2, fence_key).await.is_some() }
    })
    .await;
    let back = {
        let nodes = nodes.clone();
        tokio::task::spawn_blocking(move || {
            nodes.servers[0].restart();
            nodes.servers[1].restart();
        })
    };
    back.await.unwrap();
    let lease = waiter
        .await
        .unwrap()
        .expect("taken once the nodes are back");
    assert!(lease.is_held());
    lease.release().await.unwrap();
}

// On Redlock, an acquire dropped while its requests are out is undone on every node the requests
// reached, about one round trip later, not at the end of the ttl: the script of a fenced call
// and the plain commands of one that cannot read its fence alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_in_flight_is_undone_on_every_node() {
    let nodes = Nodes::start(3);
    let proxies = nodes.proxies().await;
    let slow = locker_through(&proxies, ms(3_000));
    // Scripts loaded first, so that the delayed acquire is one round trip.
    cycle(&slow, "warm", &opts(1_000)).await;
    let direct = nodes.locker(ms(1_000));
    let unfenced = lock_runtime::__private::without_fence(opts(10_000));
    for (name, o) in [("dropped", opts(10_000)), ("dropped-plain", unfenced)] {
        let key = direct.key_of(name);
        for p in &proxies {
            p.delay(ms(100));
        }
        let gave_up = tokio::time::timeout(ms(150), slow.acquire(name, &o)).await;
        assert!(
            gave_up.is_err(),
            "{name}: the acquire should still have been out"
        );
        // The fault is real: a majority granted it to the caller that gave up, so nobody else
        // could take the lock before its ttl. (On a loaded machine the third node's grant can
        // land later: under three busy loops, 3 to 5 runs in 30 saw two holders here; the end
        // of the test checks every node.)
        let granted = nodes.holders(&key).await.len();
        assert!(
            granted >= 2,
            "{name}: only {granted} of 3 nodes granted the dropped acquire"
        );
        let (lease, waited) =
            acquire_timed(&direct, name, &opts(10_000).with_wait(ms(5_000))).await;
        assert!(
            waited < ms(1_000),
            "{name}: the next caller waited {waited:?}, not about one round trip"
        );
        // Undone on every node, the late one included: soon no node holds any value but the
        // new lease's (the dropped caller's would stay for its 10 s ttl).
        eventually(
            ms(2_000),
            "the dropped acquire's key is gone from every node",
            || async {
                for i in 0..nodes.servers.len() {
                    if nodes
                        .get(i, &key)
                        .await
                        .is_some_and(|value| value != lease.token())
                    {
                        return false;
                    }
                }
                true
            },
        )
        .await;
        lease.release().await.unwrap();
        for p in &proxies {
            p.delay(ms(0));
        }
    }
}

// On Redlock, fences keep growing across restarts that load older snapshots.
#[tokio::test]
async fn fences_grow_across_restarts_from_older_snapshots_on_every_node() {
    let nodes = Nodes::start(3);
    let locker = nodes.locker(ms(1_000));
    let o = opts(5_000);
    let mut fences = cycles(&locker, "snap", &o, 3, |_| false).await;
    for i in 0..3 {
        let () = nodes.query(i, &redis::cmd("SAVE")).await;
    }
    fences.extend(cycles(&locker, "snap", &o, 3, |_| false).await);
    for s in &nodes.servers {
        s.kill();
        s.restart();
    }
    let fence_key = format!("{}:fence", locker.key_of("snap"));
    // Every lease was granted by a majority, whose counters were written before it was handed
    // out, so at least two nodes saved one; a node that lagged (a loaded machine) may have
    // saved none.
    let mut saved = 0;
    for i in 0..3 {
        if let Some(counter) = nodes.get(i, &fence_key).await {
            let counter: u64 = counter.parse().unwrap();
            assert!(
                counter < fences[5],
                "node {i} came back with the older counter"
            );
            saved += 1;
        }
    }
    assert!(saved >= 2, "only {saved} nodes came back with a counter");
    let coming_back = |e: &LockError| matches!(e, LockError::QuorumUnavailable { .. });
    fences.extend(cycles(&locker, "snap", &o, 3, coming_back).await);
    assert_increasing(&fences, "fences across the restarts");
}

/// A node's attempt (the leaner script of a server without a waiter queue) takes the key first
/// and the fence after: a key of another type, or a fence counter that is not a number, on a
/// majority fails the attempt with the reason from each node, leaves those values untouched and
/// leaves no key of ours behind; on a minority the lock is still taken on the others.
#[tokio::test]
async fn values_of_another_kind_on_a_majority_fail_the_attempt_and_stay_untouched() {
    let nodes = Nodes::start(3);
    let locker = nodes.locker(ms(1_000));
    let list = |key: &str| redis::cmd("RPUSH").arg(key).arg("a").arg("b").clone();
    let len = |key: &str| redis::cmd("LLEN").arg(key).clone();

    // Lists at the lock's key on nodes 0 and 1.
    let key = locker.key_of("listed");
    for i in [0, 1] {
        let _: i64 = nodes.query(i, &list(&key)).await;
    }
    let err = locker.acquire("listed", &opts(5_000)).await.unwrap_err();
    let LockError::QuorumUnavailable { failures, .. } = &err else {
        panic!("expected QuorumUnavailable: {err}");
    };
    assert_eq!(failed_nodes(&nodes, failures), [0, 1], "{err}");
    assert!(
        failures.iter().all(|(_, why)| why.contains("list")),
        "{err}"
    );
    for i in [0, 1] {
        assert_eq!(
            nodes.query::<i64>(i, &len(&key)).await,
            2,
            "node {i}: list touched"
        );
    }
    // Node 2 granted it (its counter moved; its reply may land after the two failures decided
    // the attempt) and the key it took is deleted again.
    let fence_key = format!("{key}:fence");
    eventually(ms(500), "node 2 takes the key and it is deleted again", || {
        let (nodes, key, fence_key) = (&nodes, &key, &fence_key);
        async move { nodes.get(2, fence_key).await.is_some() && nodes.get(2, key).await.is_none() }
    })
    .await;

    // Fence counters that are not numbers on nodes 1 and 2.
    let key = locker.key_of("badfence");
    let fence_key = format!("{key}:fence");
    for i in [1, 2] {
        let () = nodes
            .query(i, redis::cmd("SET").arg(&fence_key).arg("not a number"))
            .await;
    }
    let err = locker.acquire("badfence", &opts(5_000)).await.unwrap_err();
    let LockError::QuorumUnavailable { failures, .. } = &err else {
        panic!("expected QuorumUnavailable: {err}");
    };
    assert_eq!(failed_nodes(&nodes, failures), [1, 2], "{err}");
    assert!(
        failures
            .iter()
            .all(|(_, why)| why.contains("not an integer counter")),
        "{err}"
    );
    for i in [1, 2] {
        assert_eq!(
            nodes.get(i, &fence_key).await.as_deref(),
            Some("not a number"),
            "node {i}"
        );
    }
    eventually(ms(500), "no key of ours left on any node", || {
        let (nodes, key) = (&nodes, &key);
        async move { nodes.holders(key).await.is_empty() }
    })
    .await;

    // On a minority (a list on node 0 only), the other two grant the lock.
    let key = locker.key_of("minority");
    let _: i64 = nodes.query(0, &list(&key)).await;
    let lease = locker.acquire("minority", &opts(5_000)).await.unwrap();
    assert!(lease.fence() > 0);
    assert_eq!(nodes.holders(&key).await, [0, 1, 2]);
    assert_eq!(
        nodes.query::<i64>(0, &len(&key)).await,
        2,
        "node 0: list touched"
    );
    lease.release().await.unwrap();
    assert_eq!(nodes.holders(&key).await, [0], "only the list is left");
}

/// A call that cannot read its fence (`#[distributed_lock]` without `guard`) takes the key on
/// each node with plain commands, no script: its fence is 0 and no counter moves. A nested call
/// that can read the fence gets one then, above every fence handed out before, written to the
/// counters of every node that holds the key; the next fenced lease counts past it.
#[tokio::test]
async fn an_unfenced_call_sends_no_script_and_a_nested_call_gets_a_majority_fence() {
    let nodes = Nodes::start(3);
    let locker = nodes.locker(ms(1_000));
    let before = cycle(&locker, "plain", &opts(5_000)).await;
    let fence_key = format!("{}:fence", locker.key_of("plain"));
    let counters = async || {
        let mut out = Vec::new();
        for i in 0..3 {
            out.push(
                nodes
                    .get(i, &fence_key)
                    .await
                    .map(|c| c.parse::<u64>().unwrap()),
            );
        }
        out
    };
    let counted = counters().await;
    for i in 0..3 {
        nodes.reset_stats(i).await;
    }
    let unfenced = lock_runtime::__private::without_fence(opts(5_000));
    let nested = locker
        .run("plain", &unfenced, async |lease| {
            assert_eq!(lease.fence(), 0, "no fence was asked for");
            for i in 0..3 {
                assert_eq!(nodes.evalsha_calls(i).await, 0, "node {i}: a script ran");
            }
            assert_eq!(counters().await, counted, "a counter moved");
            let inner = locker.acquire("plain", &opts(5_000)).await.unwrap();
            inner.fence()
        })
        .await
        .unwrap();
    assert!(nested > before, "nested fence {nested} after {before}");
    for (i, counter) in counters().await.into_iter().enumerate() {
        assert!(
            counter >= Some(nested),
            "node {i}: counter {counter:?} below {nested}"
        );
    }
    let after = cycle(&locker, "plain", &opts(5_000)).await;
    assert!(after > nested, "fence {after} after the nested {nested}");

    // Gone from a majority meanwhile: the nested call is told the lease is lost, not fenced.
    let key = locker.key_of("plain");
    let out = locker
        .run("plain", &unfenced, async |_lease| {
            for i in [0, 1] {
                let _: i64 = nodes.query(i, redis::cmd("DEL").arg(&key)).await;
            }
            locker
                .acquire("plain", &opts(5_000))
                .await
                .map(|l| l.fence())
        })
        .await
        .unwrap_or_else(Err);
    assert_eq!(lost_reason(&out), Some(LostReason::NotOwner), "{out:?}");
}

/// An unfenced attempt that finds the key held learns its expiry from the same round trip: a
/// waiter whose holder never releases (a crashed process) takes the lock at the expiry, not
/// after a growing pause; a key of another type is named and left as it is.
#[tokio::test]
async fn an_unfenced_attempt_waits_for_the_expiry_and_names_a_foreign_key() {
    let nodes = Nodes::start(3);
    let locker = nodes.locker(ms(1_000));
    let unfenced = lock_runtime::__private::without_fence(opts(5_000));
    let key = locker.key_of("crashed");
    for i in 0..3 {
        nodes.set(i, &key, "a holder that crashed", 1_500).await;
    }
    let (lease, waited) = timed(locker.acquire("crashed", &unfenced.with_wait(ms(5_000)))).await;
    let lease = lease.unwrap();
    assert!(
        waited >= ms(1_000),
        "taken after {waited:?}, before the expiry"
    );
    // A growing pause (20 ms doubled up to 1 s) would have come back at 1.26 s or 2.26 s.
    assert!(waited < ms(2_200), "taken {waited:?} after the start");
    lease.release().await.unwrap();

    let key = locker.key_of("listed");
    for i in 0..3 {
        let _: i64 = nodes.query(i, redis::cmd("RPUSH").arg(&key).arg("a")).await;
    }
    let err = locker.acquire("listed", &unfenced).await.unwrap_err();
    let LockError::QuorumUnavailable { failures, .. } = &err else {
        panic!("expected QuorumUnavailable: {err}");
    };
    // Decided once two of them said so.
    assert!(failed_nodes(&nodes, failures).len() >= 2, "{err}");
    assert!(
        failures.iter().all(|(_, why)| why.contains("list")),
        "{err}"
    );
    for i in 0..3 {
        let len: i64 = nodes.query(i, redis::cmd("LLEN").arg(&key)).await;
        assert_eq!(len, 1, "node {i}: list touched");
    }
}

/// With `replicas(1)` on nodes that have no replica, every node's `WAIT` comes back short: the
/// attempt fails, naming the acknowledgements on each node, and deletes what it took, for a
/// fenced call (the script) and for one without a fence (plain commands) alike.
#[tokio::test]
async fn an_unacknowledged_attempt_fails_and_leaves_no_key_on_any_node() {
    let nodes = Nodes::start(3);
    // The scripts loaded: a `WAIT` behind a script's first, refused, call would run twice.
    cycle(&nodes.locker(ms(1_000)), "warm", &opts(1_000)).await;
    // A node's request may take a tenth of the validity (about 500 ms here): the `WAIT` gives
    // up within half of that, and its short count is the answer.
    let unfenced = lock_runtime::__private::without_fence(opts(5_000));
    for (name, o) in [("acked", opts(5_000)), ("acked-plain", unfenced)] {
        // A locker of its own: each `WAIT` holds its connection, and the cleanup of one
        // attempt would queue the next one's request behind it.
        let locker = Locker::builder()
            .urls(nodes.urls())
            .replicas(1)
            .response_timeout(ms(5_000))
            .build()
            .unwrap();
        let err = locker.acquire(name, &o).await.unwrap_err();
        let LockError::QuorumUnavailable { failures, .. } = &err else {
            panic!("{name}: expected QuorumUnavailable: {err}");
        };
        assert!(failed_nodes(&nodes, failures).len() >= 2, "{name}: {err}");
        assert!(
            failures
                .iter()
                .all(|(_, why)| why.contains("only 0 of the 1 replica")),
            "{name}: {err}"
        );
        let key = locker.key_of(name);
        eventually(ms(1_000), "no key left on any node", || {
            let (nodes, key) = (&nodes, &key);
            async move { nodes.holders(key).await.is_empty() }
        })
        .await;
    }
}
