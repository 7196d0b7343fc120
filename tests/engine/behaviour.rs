//! Behaviours written once and run on every kind of deployment that allows them: one server,
//! Redis Cluster, Sentinel (a primary, a replica that acknowledges each grant, 3 sentinels) and
//! Redlock over 3 servers. Each kind's servers start once per process and are shared; each case
//! has a key prefix of its own (see `support::deployments`).
//!
//! The table at the end says which kinds run each case. Redlock leaves out what it does not
//! have: a waiter queue (its waiters retry on each release, in no order) and the `permits` and
//! `shared` modes, which it refuses with a `Config` error (`permits.rs` and `shared.rs` test
//! that refusal).

use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use lock_runtime::{LockError, LockOptions};
use support::deployments::{Env, Kind};
use support::{assert_increasing, eventually, ms, within};

/// The lease of the cases that outlive three of them: only renewal keeps their keys. Long
/// enough that a loaded machine's late renewal (with Sentinel, acknowledged by the replica)
/// still comes within it.
const LEASE: Duration = Duration::from_millis(2_000);

/// Waits (bounded) until no node has a key of the lock `name`: released, or never taken.
async fn no_key_left(env: &Env, name: &str, what: &str) {
    eventually(ms(5_000), &format!("{:?}: {what}", env.kind), || async {
        env.nodes_holding(name).await == 0
    })
    .await;
}

/// Asserts that the lock `name` is held on the servers: on as many nodes as a hold needs.
async fn assert_on_the_servers(env: &Env, name: &str, what: &str) {
    let n = env.nodes_holding(name).await;
    assert!(n >= env.quorum(), "{:?}: {what}: on {n} nodes", env.kind);
}

fn assert_busy<T>(res: Result<T, LockError>, what: &str) {
    match res {
        Err(LockError::Busy { .. }) => {}
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what}: granted"),
    }
}

/// Waits (bounded) until a waiter waits for the lock `name`: queued, or with Redlock (no
/// queue), listening for its release on every node.
async fn waiting(env: &Env, name: &str, n: usize) {
    eventually(ms(5_000), &format!("{n} waiting on {name}"), || async {
        match env.kind {
            Kind::Redlock => env.listeners(name).await >= 3 * n as i64,
            _ => env.waiters(name).await == n,
        }
    })
    .await;
}

async fn waiters_are_served_in_arrival_order(env: &Env) {
    let name = "fifo";
    let o = LockOptions::new(ms(30_000));
    let holder = env.locker.acquire(name, &o).await.unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (locker, served, o) = (env.connect().await, served.clone(), o.with_wait(ms(20_000)));
        waiters.push(tokio::spawn(async move {
            let lease = locker.acquire(name, &o).await.unwrap();
            served.lock().unwrap().push((i, lease.fence()));
            lease.release().await.unwrap();
        }));
        // The next waiter arrives only once this one has its place.
        waiting(env, name, i + 1).await;
    }
    holder.release().await.unwrap();
    for w in waiters {
        within(ms(20_000), w, "served").await;
    }
    let served = served.lock().unwrap().clone();
    let order: Vec<usize> = served.iter().map(|s| s.0).collect();
    assert_eq!(order, [0, 1, 2, 3], "{:?}: not in arrival order", env.kind);
    let fences: Vec<u64> = served.iter().map(|s| s.1).collect();
    assert_increasing(&fences, "the waiters' fences");
    no_key_left(env, name, "every waiter released").await;
}

/// A release hands the lock to a waiter: far sooner than the holder's 30 s key would expire.
async fn a_release_hands_the_lock_to_a_waiter(env: &Env) {
    let name = "hand-over";
    let o = LockOptions::new(ms(30_000));
    let holder = env.locker.acquire(name, &o).await.unwrap();
    let fence = holder.fence();
    let waiter = {
        let (locker, o) = (env.connect().await, o.with_wait(ms(20_000)));
        tokio::spawn(async move { locker.acquire(name, &o).await })
    };
    waiting(env, name, 1).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    holder.release().await.unwrap();
    let lease = within(ms(10_000), waiter, "woken by the release")
        .await
        .expect("the lock, once released");
    assert!(lease.fence() > fence, "{} after {fence}", lease.fence());
    assert_on_the_servers(env, name, "the waiter's hold").await;
    lease.release().await.unwrap();
    no_key_left(env, name, "the waiter released").await;
}

/// Two permits: two holders at once (each its own fence), a third is busy, the holds outlive
/// three leases, callers of another mode are refused, a release hands a permit to a waiter,
/// and the last permit out frees the name for any mode.
async fn at_most_n_permits_hold_at_once(env: &Env) {
    let name = "partner";
    let o = LockOptions::new(ms(20_000))
        .with_lease(LEASE)
        .with_permits(2);
    let (a, b) = (env.connect().await, env.connect().await);
    let first = a.acquire(name, &o).await.unwrap();
    let second = b.acquire(name, &o).await.unwrap();
    assert!(second.fence() > first.fence());
    assert_busy(env.locker.acquire(name, &o).await, "a third permit");
    // Three leases pass: only renewal keeps the permits (and the mode mark) alive.
    tokio::time::sleep(3 * LEASE).await;
    assert!(first.is_held() && second.is_held(), "renewed");
    assert_busy(env.locker.acquire(name, &o).await, "a third permit, later");
    for other in [
        LockOptions::new(ms(20_000)),
        LockOptions::new(ms(20_000)).with_shared(true),
        LockOptions::new(ms(20_000)).with_permits(3),
    ] {
        let err = env.locker.acquire(name, &other).await.unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err}");
        assert!(err.to_string().contains("held with permits = 2"), "{err}");
    }
    let waiter = {
        let (b, o) = (b.clone(), o.with_wait(ms(20_000)));
        tokio::spawn(async move { b.acquire(name, &o).await })
    };
    waiting(env, name, 1).await;
    first.release().await.unwrap();
    let third = within(ms(10_000), waiter, "the freed permit")
        .await
        .unwrap();
    assert!(third.fence() > second.fence());
    third.release().await.unwrap();
    second.release().await.unwrap();
    let exclusive = a.acquire(name, &LockOptions::new(ms(20_000))).await;
    exclusive
        .expect("free for any mode")
        .release()
        .await
        .unwrap();
    no_key_left(env, name, "every permit released").await;
}

/// Shared holders run together and outlive three leases; an exclusive caller waits for the last
/// of them, and goes before a shared caller that came after it.
async fn shared_holds_run_together_and_an_exclusive_one_alone(env: &Env) {
    let name = "catalog";
    let shared = LockOptions::new(ms(20_000))
        .with_lease(LEASE)
        .with_shared(true);
    let exclusive = LockOptions::new(ms(20_000));
    let (a, b) = (env.connect().await, env.connect().await);
    let first = a.acquire(name, &shared).await.unwrap();
    let second = b.acquire(name, &shared).await.unwrap();
    assert_busy(env.locker.acquire(name, &exclusive).await, "a writer");
    tokio::time::sleep(3 * LEASE).await;
    assert!(first.is_held() && second.is_held(), "renewed");
    let served = Arc::new(Mutex::new(Vec::new()));
    let caller = |locker: lock_runtime::Locker, o: LockOptions, who: &'static str| {
        let served = served.clone();
        tokio::spawn(async move {
            let lease = locker
                .acquire(name, &o.with_wait(ms(20_000)))
                .await
                .unwrap();
            served.lock().unwrap().push(who);
            let fence = lease.fence();
            lease.release().await.unwrap();
            fence
        })
    };
    let writer = caller(b.clone(), exclusive, "writer");
    waiting(env, name, 1).await;
    let late = caller(a.clone(), shared, "later reader");
    waiting(env, name, 2).await;
    first.release().await.unwrap();
    assert!(
        served.lock().unwrap().is_empty(),
        "in beside a shared holder"
    );
    let last = second.fence();
    second.release().await.unwrap();
    let writer_fence = within(ms(10_000), writer, "the writer, after the last reader").await;
    within(ms(10_000), late, "the later reader, after the writer").await;
    assert!(writer_fence > last);
    assert_eq!(*served.lock().unwrap(), ["writer", "later reader"]);
    no_key_left(env, name, "every hold released").await;
}

/// A lease taken by hand is on the servers, renewed past three leases, busy for others, free
/// once released; a lease dropped without a release is released all the same.
async fn a_lease_by_hand_is_renewed_and_released(env: &Env) {
    let name = "by-hand";
    let o = LockOptions::new(ms(20_000)).with_lease(LEASE);
    let lease = env.locker.acquire(name, &o).await.unwrap();
    assert_on_the_servers(env, name, "taken").await;
    tokio::time::sleep(3 * LEASE).await;
    assert!(lease.is_held(), "renewed");
    assert_on_the_servers(env, name, "past three leases").await;
    let other = env.connect().await;
    assert_busy(other.acquire(name, &o).await, "held by another");
    let fence = lease.fence();
    lease.release().await.unwrap();
    let next = other.acquire(name, &o).await.expect("free once released");
    assert!(next.fence() > fence);
    next.release().await.unwrap();
    // A key of 20 s, gone long before: the drop released it.
    let dropped = other.acquire(name, &LockOptions::new(ms(20_000))).await;
    drop(dropped.unwrap());
    no_key_left(env, name, "a dropped lease released").await;
}

/// Every way out of a locked call releases the lock: the next caller takes it at once.
async fn every_return_path_releases(env: &Env) {
    let name = "paths";
    let o = LockOptions::new(ms(30_000));
    let next = env.connect().await;
    let free = async |what: &str| {
        let lease = next.acquire(name, &o).await;
        let lease = lease.unwrap_or_else(|e| panic!("{:?}: {what}: {e}", env.kind));
        lease.release().await.unwrap();
    };
    assert_eq!(env.locker.run(name, &o, async |_| 7).await.unwrap(), 7);
    free("a normal return").await;
    let failed = env
        .locker
        .run(name, &o, async |_| {
            Err::<(), _>(std::io::Error::other("boom"))?;
            Ok::<_, std::io::Error>(())
        })
        .await;
    assert!(failed.unwrap().is_err());
    free("`?` in the body").await;
    let locker = env.locker.clone();
    let panicked = tokio::spawn(async move {
        locker
            .run(name, &o, async |_| panic!("body panicked"))
            .await
    });
    assert!(panicked.await.unwrap_err().is_panic());
    free("a panic").await;
    let slow = o.with_max_exec(ms(100));
    let cut = env
        .locker
        .run(name, &slow, async |_| tokio::time::sleep(ms(30_000)).await)
        .await;
    assert!(
        matches!(cut, Err(LockError::MaxExecExceeded { .. })),
        "{cut:?}"
    );
    free("max_exec").await;
    no_key_left(env, name, "every call released").await;
}

/// A future that drops the one it wraps after it was pending `limit` times: a caller that
/// gives up at that await.
struct CutAfter<F> {
    inner: Pin<Box<F>>,
    pending: usize,
    limit: usize,
}

impl<F: Future> Future for CutAfter<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.inner.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending if self.pending + 1 >= self.limit => Poll::Ready(None),
            Poll::Pending => {
                self.pending += 1;
                Poll::Pending
            }
        }
    }
}

/// A locked call dropped at each of its awaits in turn (acquire, body, release) leaves no key
/// behind: each is gone long before its 30 s, and the next call takes the lock at once.
async fn a_call_dropped_at_any_await_leaves_no_key(env: &Env) {
    let name = "dropped";
    let o = LockOptions::new(ms(30_000));
    let mut cuts = 0;
    for limit in 1..=100 {
        let call = env.locker.run(name, &o, async |_| {
            tokio::time::sleep(ms(1)).await;
        });
        let cut = CutAfter {
            inner: Box::pin(call),
            pending: 0,
            limit,
        };
        match cut.await {
            Some(done) => {
                done.unwrap_or_else(|e| panic!("{:?}: after {cuts} cuts: {e}", env.kind));
                assert!(cuts >= 1, "{:?}: the call never awaited", env.kind);
                return;
            }
            None => cuts += 1,
        }
        no_key_left(env, name, &format!("dropped at await {limit}")).await;
    }
    panic!("{:?}: the call never completed", env.kind);
}

/// Each case on the kinds named, as one test per kind: `<case>::<kind>`.
macro_rules! cases {
    ($($case:ident: $($kind:ident)+;)*) => {$(
        mod $case {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $kind() {
                    let kind = super::Kind::named(stringify!($kind));
                    let env = super::Env::start(kind, stringify!($case)).await;
                    super::$case(&env).await;
                }
            )+
        }
    )*};
}

// Redlock: no waiter queue, so no arrival order; `permits` and `shared` are refused.
cases! {
    waiters_are_served_in_arrival_order: standalone cluster sentinel in_memory;
    a_release_hands_the_lock_to_a_waiter: standalone cluster sentinel redlock in_memory;
    at_most_n_permits_hold_at_once: standalone cluster sentinel in_memory;
    shared_holds_run_together_and_an_exclusive_one_alone: standalone cluster sentinel in_memory;
    a_lease_by_hand_is_renewed_and_released: standalone cluster sentinel redlock in_memory;
    every_return_path_releases: standalone cluster sentinel redlock in_memory;
    a_call_dropped_at_any_await_leaves_no_key: standalone cluster sentinel redlock in_memory;
}
