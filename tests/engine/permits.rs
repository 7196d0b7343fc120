//! `permits = N`: up to N holders at once, each with its own lease, renewal, fence and release.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lock_runtime::{LockError, LockOptions, Locker, distributed_lock};
use lock_testing::{FaultProxy, RedisServer};
use support::holder::{Holder, num_field};
use support::{
    Env, assert_every_key_expires, assert_mentions, eventually, ms, query, raw_connection,
};
use tokio::time::Instant;

/// How many bodies run at once, and the most seen.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Inside {
    async fn stay(&self, for_ms: u64) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(ms(for_ms)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// 8 tasks share 3 permits: 3 run at once, never more; every holder gets its own fence, and the
/// fences of the name grow across holders. The unsafe control: the same tasks without the lock
/// run 8 at once (the count can see more than 3).
#[tokio::test]
async fn at_most_n_hold_at_once_and_each_holder_has_its_own_fence() {
    let env = Env::start().await;
    let o = LockOptions::new(ms(5_000))
        .with_permits(3)
        .with_wait(ms(10_000));
    let inside = Arc::new(Inside::default());
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (locker, inside) = (env.locker.clone(), Arc::clone(&inside));
            tokio::spawn(async move {
                let mut fences = Vec::new();
                for _ in 0..5 {
                    let fence = locker
                        .run("partner-api", &o, async |lease| {
                            inside.stay(20).await;
                            lease.fence()
                        })
                        .await
                        .expect("a permit within the wait");
                    fences.push(fence);
                }
                fences
            })
        })
        .collect();
    let mut fences = Vec::new();
    for task in tasks {
        let own = task.await.unwrap();
        support::assert_increasing(&own, "one task's fences");
        fences.extend(own);
    }
    assert_eq!(
        inside.most.load(Ordering::SeqCst),
        3,
        "the most inside at once"
    );
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), 40, "every holder has a fence of its own");
    // No permit is left held.
    let raw = raw_connection(&env.server.url()).await;
    let keys: Vec<String> =
        query(&raw, redis::cmd("KEYS").arg("lock:{partner-api}:permit:*")).await;
    assert!(keys.is_empty(), "{keys:?}");

    let control = Arc::new(Inside::default());
    let unlocked: Vec<_> = (0..8)
        .map(|_| {
            let control = Arc::clone(&control);
            tokio::spawn(async move { control.stay(50).await })
        })
        .collect();
    for task in unlocked {
        task.await.unwrap();
    }
    assert_eq!(control.most.load(Ordering::SeqCst), 8, "the control");
    assert_every_key_expires(&env.server).await;
}

/// A holder process killed with SIGKILL gives its permit back when its lease runs out (no
/// leaked permits), while the other holder keeps its own.
#[tokio::test]
async fn a_crashed_holders_permit_comes_back_within_its_lease() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let spawn = || {
        Holder::spawn(
            "hold",
            &[
                ("redis", server.url()),
                ("name", "crashy".to_owned()),
                ("ttl", "60000".to_owned()),
                ("lease", "300".to_owned()),
                ("permits", "2".to_owned()),
            ],
        )
    };
    let (mut a, mut b) = (spawn(), spawn());
    let a_fence = num_field(&a.expect("acquired", ms(10_000)).await, "fence");
    let b_fence = num_field(&b.expect("acquired", ms(10_000)).await, "fence");
    assert_ne!(a_fence, b_fence);
    let o = LockOptions::new(ms(1_000)).with_permits(2);
    tokio::time::sleep(ms(600)).await;
    let busy = locker.acquire("crashy", &o).await.unwrap_err();
    assert!(
        matches!(busy, LockError::Busy { .. }),
        "both permits held: {busy}"
    );
    a.kill();
    let killed = Instant::now();
    let lease = locker
        .acquire("crashy", &o.with_wait(ms(10_000)))
        .await
        .expect("the dead holder's permit");
    let waited = killed.elapsed();
    assert!(
        waited <= ms(500),
        "the permit came back {waited:?} after the crash"
    );
    assert!(lease.fence() > a_fence.max(b_fence));
    // The live holder still holds its own: no third permit.
    let busy = locker.acquire("crashy", &o).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    lease.release().await.unwrap();
    b.kill();
    assert_every_key_expires(&server).await;
}

/// Everyone using one name must agree on N: another N is a `Config` error naming both numbers,
/// and nothing is taken.
#[tokio::test]
async fn another_number_of_permits_is_a_config_error_naming_both() {
    let env = Env::start().await;
    let three = LockOptions::new(ms(5_000)).with_permits(3);
    let held = env.locker.acquire("api", &three).await.unwrap();
    let five = LockOptions::new(ms(5_000)).with_permits(5);
    let err = env.locker.acquire("api", &five).await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert_mentions(&err, &["api", "permits = 5", "permits = 3", "`lock:{api}`"]);
    held.release().await.unwrap();
    // No holder left: the name is free for another N.
    let held = env.locker.acquire("api", &five).await.unwrap();
    held.release().await.unwrap();
    for bad in [0, 1_001] {
        let err = LockOptions::new(ms(5_000))
            .with_permits(bad)
            .validate()
            .unwrap_err();
        assert_mentions(&err, &[&format!("permits = {bad}")]);
    }
    assert_every_key_expires(&env.server).await;
}

/// On Redlock's independent servers each could grant a different permit: refused.
#[tokio::test]
async fn permits_on_redlock_are_a_config_error() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let locker = Locker::builder()
        .urls(servers.iter().map(RedisServer::url))
        .connect()
        .await
        .unwrap();
    let o = LockOptions::new(ms(5_000)).with_permits(2);
    let err = locker.acquire("api", &o).await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert_mentions(&err, &["permits = 2", "Redlock"]);
    for server in &servers {
        assert_every_key_expires(server).await;
    }
}

/// A nested locked call on the name runs under the permit its task holds, as for a lock: it
/// takes no second permit.
#[tokio::test]
async fn a_nested_call_runs_under_the_held_permit() {
    let env = Env::start().await;
    let o = LockOptions::new(ms(5_000)).with_permits(2);
    let (outer, inner) = env
        .locker
        .run("nested", &o, async |lease| {
            let inner = env
                .locker
                .run("nested", &o, async |inner| inner.fence())
                .await
                .unwrap();
            (lease.fence(), inner)
        })
        .await
        .unwrap();
    assert_eq!(outer, inner);
    assert_every_key_expires(&env.server).await;
}

/// An attempt dropped while its request is on its way frees the permit it took, about one round
/// trip later, not at the end of its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_dropped_in_flight_frees_its_permit() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locker = Locker::connect(&proxy.url()).await.unwrap();
    let o = LockOptions::new(ms(60_000)).with_permits(2);
    // Scripts loaded before the delay.
    support::cycle(&locker, "dropped", &o).await;
    let raw = raw_connection(&server.url()).await;
    let taken = |raw: &redis::aio::MultiplexedConnection| {
        let raw = raw.clone();
        async move {
            let keys: Vec<String> =
                query(&raw, redis::cmd("KEYS").arg("lock:{dropped}:permit:*")).await;
            keys.len()
        }
    };
    proxy.delay(ms(100));
    // Dropped after the request reached the server, before its reply came back.
    let dropped = tokio::time::timeout(ms(150), locker.acquire("dropped", &o)).await;
    assert!(dropped.is_err(), "the attempt finished: {dropped:?}");
    assert_eq!(taken(&raw).await, 1, "the dropped attempt took a permit");
    eventually(
        ms(2_000),
        "the dropped attempt's permit is freed",
        || async { taken(&raw).await == 0 },
    )
    .await;
    assert_every_key_expires(&server).await;
}

#[distributed_lock(name = "partner:{region}", ttl = "5s", permits = 2, wait = "5s", locker = locker)]
async fn call_partner(locker: &Locker, region: &str, inside: &Inside) -> Result<(), LockError> {
    inside.stay(30).await;
    Ok(())
}

/// Through the attribute: `permits = 2` lets two calls in at once.
#[tokio::test]
async fn the_attribute_takes_a_permit() {
    let env = Env::start().await;
    let inside = Arc::new(Inside::default());
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let (locker, inside) = (env.locker.clone(), Arc::clone(&inside));
            tokio::spawn(async move { call_partner(&locker, "eu", &inside).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().expect("a permit within the wait");
    }
    assert_eq!(inside.most.load(Ordering::SeqCst), 2);
    assert_every_key_expires(&env.server).await;
}

/// Waiters for permits are served in arrival order: each release hands its permit to the first
/// waiter in line (by id, at once), and a caller that comes later, even one that does not wait,
/// does not cut in.
#[tokio::test]
async fn permit_waiters_are_served_in_arrival_order() {
    let env = Env::start().await;
    let raw = raw_connection(&env.server.url()).await;
    let o = LockOptions::new(ms(10_000)).with_permits(2);
    let mut held = vec![
        env.locker.acquire("fifo", &o).await.unwrap(),
        env.locker.acquire("fifo", &o).await.unwrap(),
    ];
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3usize {
        let (locker, order) = (env.locker.clone(), Arc::clone(&order));
        let o = o.with_wait(ms(10_000));
        waiters.push(tokio::spawn(async move {
            let lease = locker.acquire("fifo", &o).await.unwrap();
            order.lock().unwrap().push(i);
            lease
        }));
        eventually(ms(2_000), "the waiter queues", || async {
            let queued: usize = query(&raw, redis::cmd("ZCARD").arg("lock:{fifo}:waiters")).await;
            queued == i + 1
        })
        .await;
    }
    for _ in 0..2 {
        let before = order.lock().unwrap().len();
        let released = Instant::now();
        held.remove(0).release().await.unwrap();
        let cut_in = env.locker.acquire("fifo", &o).await;
        assert!(matches!(cut_in, Err(LockError::Busy { .. })), "{cut_in:?}");
        eventually(ms(1_000), "the first in line gets the permit", || async {
            order.lock().unwrap().len() > before
        })
        .await;
        assert!(released.elapsed() < ms(1_000));
    }
    assert_eq!(
        *order.lock().unwrap(),
        [0, 1],
        "served out of arrival order"
    );
    let (first, second) = (
        waiters.remove(0).await.unwrap(),
        waiters.remove(0).await.unwrap(),
    );
    first.release().await.unwrap();
    let third = waiters.remove(0).await.unwrap();
    assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
    second.release().await.unwrap();
    third.release().await.unwrap();
    assert_every_key_expires(&env.server).await;
}

/// A permit that comes free without a release (its holder crashed, and its key expired) goes to
/// the first waiter in line: a caller that does not queue, trying again and again meanwhile,
/// never gets it first.
#[tokio::test]
async fn a_permit_freed_by_expiry_goes_to_the_first_in_line() {
    let env = Env::start().await;
    let raw = raw_connection(&env.server.url()).await;
    let o = LockOptions::new(ms(10_000)).with_permits(2);
    let held = env.locker.acquire("expiry", &o).await.unwrap();
    // The other permit, held by a holder that crashed: it expires in 400 ms.
    let crashed = held.token().replacen(&held.token()[..4], "dead", 1);
    support::set_for(&env, "lock:{expiry}:permit:1", &crashed, ms(400)).await;
    let waiter = {
        let (locker, o) = (env.locker.clone(), o.with_wait(ms(5_000)));
        tokio::spawn(async move { locker.acquire("expiry", &o).await.map(|l| l.fence()) })
    };
    eventually(ms(2_000), "the waiter queues", || async {
        let queued: usize = query(&raw, redis::cmd("ZCARD").arg("lock:{expiry}:waiters")).await;
        queued == 1
    })
    .await;
    let mut cut_in = 0;
    while !waiter.is_finished() {
        if let Ok(lease) = env.locker.acquire("expiry", &o).await {
            cut_in += 1;
            lease.release().await.unwrap();
        }
        tokio::time::sleep(ms(2)).await;
    }
    assert!(waiter.await.unwrap().unwrap() > held.fence());
    assert_eq!(
        cut_in, 0,
        "a caller that came later took the freed permit first"
    );
    assert_every_key_expires(&env.server).await;
}

/// One name, several modes: a caller whose mode (or N) is not the holders' gets a `Config`
/// error naming the lock, the mode in use and what to change, on the uncontended path and on
/// the waiting one, and is never inside beside them; callers of the holders' mode join or wait
/// as usual. Exclusive and shared holds are the two sides of one read-write lock.
#[tokio::test]
async fn a_caller_of_another_mode_is_refused_and_never_inside_with_the_holders() {
    let env = Env::start().await;
    let permits = |n| LockOptions::new(ms(5_000)).with_permits(n);
    let exclusive = LockOptions::new(ms(5_000));
    let shared = LockOptions::new(ms(5_000)).with_shared(true);
    let held = env.locker.acquire("mix", &permits(3)).await.unwrap();
    let refused = [
        (exclusive, "an exclusive hold"),
        (exclusive.with_wait(ms(2_000)), "an exclusive hold"),
        (permits(1), "an exclusive hold"),
        (shared, "a shared hold"),
        (shared.with_wait(ms(2_000)), "a shared hold"),
        (permits(2).with_wait(ms(2_000)), "permits = 2"),
    ];
    for (o, asked) in &refused {
        let started = Instant::now();
        let err = env.locker.acquire("mix", o).await.unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{asked}: {err}");
        assert_mentions(
            &err,
            &[
                "mix",
                asked,
                "held with permits = 3",
                "`lock:{mix}`",
                "permits = 3, or use",
            ],
        );
        // Refused at once, not after waiting.
        assert!(
            started.elapsed() < ms(1_000),
            "{asked}: {:?}",
            started.elapsed()
        );
    }
    // The holders' mode joins.
    let second = env.locker.acquire("mix", &permits(3)).await.unwrap();
    for lease in [held, second] {
        lease.release().await.unwrap();
    }
    // Free again: any mode takes it; then permits are refused beside an exclusive or a shared
    // holder.
    for (o, in_use) in [(exclusive, "an exclusive hold"), (shared, "shared holds")] {
        let holder = env.locker.acquire("mix", &o).await.unwrap();
        let err = env.locker.acquire("mix", &permits(3)).await.unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err}");
        assert_mentions(
            &err,
            &["asks for permits = 3", &format!("held with {in_use}")],
        );
        holder.release().await.unwrap();
    }
    assert!(!env.exists(&env.key("mix")).await);
}

/// What tells callers which N the holders use lives exactly as long as some holder does: with a
/// fence counter kept only 300 ms, three holders renewing for 2 s still keep another N out (no
/// fourth, fifth caller gets in beside them); once they have gone, another N is taken at once.
#[tokio::test]
async fn the_holders_n_lives_as_long_as_they_do() {
    let env = Env::start().await;
    let locker = env.locker_with(|b| b.fence_retention(Some(ms(300)))).await;
    let three = LockOptions::new(ms(10_000))
        .with_lease(ms(600))
        .with_permits(3);
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(locker.acquire("pool", &three).await.unwrap());
    }
    tokio::time::sleep(ms(2_000)).await;
    let five = LockOptions::new(ms(10_000)).with_permits(5);
    let err = locker.acquire("pool", &five).await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert_mentions(&err, &["held with permits = 3", "`lock:{pool}`"]);
    assert!(leases.iter().all(|l| l.is_held()));
    for lease in leases {
        lease.release().await.unwrap();
    }
    let taken = locker.acquire("pool", &five).await.unwrap();
    taken.release().await.unwrap();
}

/// The permits' mark on the lock's key keeps the other modes out; a fault that deletes it (an
/// eviction, a `DEL`) lets them in beside the permit holders, as deleting a held key lets the
/// next holder in. The holders learn it at their next renewal, or at their release if that comes
/// first, when the mark is no longer their N's; a holder of their N that set the mark again first
/// keeps them held, and keeps the other modes out again.
#[tokio::test]
async fn a_deleted_mark_lets_another_mode_in_and_the_permit_holders_are_told() {
    let env = Env::start().await;
    let three = LockOptions::new(ms(30_000)).with_permits(3);
    // `a` renews every 200 ms; `b` not before its release.
    let a = env
        .locker
        .acquire("marked", &three.with_lease(ms(600)))
        .await;
    let b = env
        .locker
        .acquire("marked", &three.with_lease(ms(30_000)))
        .await;
    let (a, b) = (a.unwrap(), b.unwrap());
    let key = env.key("marked");
    assert_eq!(env.get(&key).await.as_deref(), Some("permits:3"));
    // Deleted and set again by a holder of the same N: nothing changes for the holders.
    env.del(&key).await;
    let c = env.locker.acquire("marked", &three).await.unwrap();
    let exclusive = LockOptions::new(ms(5_000));
    let err = env.locker.acquire("marked", &exclusive).await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    c.release().await.unwrap();
    // Deleted, and an exclusive caller is first: it gets in beside the two holders (the fault
    // happened). `b`'s release says it was lost; `a`'s next renewal tells it.
    env.del(&key).await;
    let intruder = env.locker.acquire("marked", &exclusive).await.unwrap();
    // Only `b` is sure not to have renewed since the deletion (`a` may have, and been told).
    assert!(b.is_held(), "b was told before its release");
    let err = b.release().await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err}");
    let told = tokio::time::timeout(ms(5_000), a.lost()).await;
    told.expect("a permit holder whose mark was taken is told");
    let err = a.release().await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err}");
    // The intruder's hold was never touched.
    assert!(intruder.is_held());
    intruder.release().await.unwrap();
    assert_every_key_expires(&env.server).await;
}
