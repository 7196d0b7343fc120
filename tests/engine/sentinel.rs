//! Sentinel: a primary, replicas and 3 Sentinels started by the test support. The replicas
//! replicate through a fault proxy, so a test can hold replication back and show what a failover
//! loses, and what `replicas(n)` keeps from being lost.
//!
//! One Sentinel set at a time (`SERIAL`): failovers are timed by real Sentinels on 2 cores.

use crate::support;

use std::sync::Arc;

use lock_runtime::{LockError, LockOptions, Locker, LockerBuilder};
use lock_testing::{RedisServer, SentinelSet};
use support::fenced::FencedStore;
use support::history::Mode;
use support::{Failure, SERIAL, assert_mentions, ms, raw_connection_to};
use tokio::sync::Notify;

/// A builder of a locker on the Sentinel set's master, asking for `replicas` acknowledgements.
fn sentinel_builder(set: &SentinelSet, replicas: usize) -> LockerBuilder {
    Locker::builder()
        .sentinel(set.sentinel_urls(), set.master_name())
        .replicas(replicas)
}

async fn sentinel_locker(set: &SentinelSet, replicas: usize) -> Locker {
    sentinel_builder(set, replicas)
        .connect()
        .await
        .expect("sentinel locker connects")
}

async fn exists(port: u16, key: &str) -> bool {
    support::exists(&raw_connection_to(port).await, key).await
}

/// The unsafe control: replication is held back, a lock is taken with `replicas(0)`, the primary
/// is killed, Sentinel promotes the replica (which never got the key), and a second holder gets
/// the same lock while the first still holds it. The checker sees the overlap: the hazard is
/// real in this set-up. The first locker also follows the new primary by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_without_replicas_lets_a_second_holder_in() {
    let _one = SERIAL.lock().await;
    let set = Arc::new(SentinelSet::builder().replica_via_proxy(true).start().await);
    let store_server = RedisServer::start();
    let store = FencedStore::connect(&store_server.url(), "nightly")
        .await
        .unwrap();
    store.reset(Mode::Unfenced).await.unwrap();
    let first = sentinel_locker(&set, 0).await;
    let old_primary = set.primary().port;
    set.proxy().unwrap().blackhole();

    let (entered, second_done) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let holder = {
        let (first, store) = (first.clone(), store.clone());
        let (entered, second_done) = (Arc::clone(&entered), Arc::clone(&second_done));
        tokio::spawn(async move {
            first
                .try_run("nightly", &LockOptions::new(ms(30_000)), async |lease| {
                    let e = store.enter("first", lease.fence()).await?;
                    entered.notify_one();
                    second_done.notified().await;
                    store.write("first", lease.fence(), e.basis).await?;
                    Ok::<_, Failure>(())
                })
                .await
        })
    };
    entered.notified().await;
    let key = first.key_of("nightly");
    assert!(
        exists(old_primary, &key).await,
        "the first holder's key is on the primary"
    );
    set.kill_primary();
    let new_primary = set.wait_for_failover().await;
    assert_ne!(new_primary, old_primary);
    assert!(
        !exists(new_primary, &key).await,
        "the promoted replica never got the key"
    );

    let second = sentinel_locker(&set, 0).await;
    second
        .try_run(
            "nightly",
            &LockOptions::new(ms(30_000)).with_wait(ms(10_000)),
            async |lease| {
                let e = store.enter("second", lease.fence()).await?;
                store.write("second", lease.fence(), e.basis).await?;
                Ok::<_, Failure>(())
            },
        )
        .await
        .expect("the second holder gets the lock the first still holds");
    second_done.notify_one();
    let _ = holder.await.unwrap();
    let report = store.check().await.unwrap();
    assert!(!report.overlaps.is_empty(), "{report}");
    assert!(
        report.unsafe_overlaps >= 1 && !report.lost_updates.is_empty(),
        "{report}"
    );

    // The first locker follows the new primary by itself.
    let lease = first
        .acquire("after", &LockOptions::new(ms(5_000)).with_wait(ms(10_000)))
        .await
        .expect("the first locker locks on the new primary");
    assert!(exists(new_primary, &first.key_of("after")).await);
    lease.release().await.unwrap();
}

/// The same sequence with `replicas(1)`. A lock taken while replication worked was
/// acknowledged, so after the failover the promoted replica has it and the second holder is
/// refused; a lock taken while replication was held back is not acknowledged, so the first
/// acquire fails (its key deleted) and nobody held it twice. 0 overlaps. The first locker then
/// follows the new primary by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_with_replicas_1_never_doubles_a_lock() {
    let _one = SERIAL.lock().await;
    // Two replicas: after the failover the new primary still has one to acknowledge.
    let set = SentinelSet::builder()
        .replicas(2)
        .replica_via_proxy(true)
        .start()
        .await;
    let store_server = RedisServer::start();
    let base = FencedStore::connect(&store_server.url(), "base")
        .await
        .unwrap();
    for name in ["acked", "unacked"] {
        base.named(name).reset(Mode::Unfenced).await.unwrap();
    }
    let first = sentinel_locker(&set, 1).await;
    let old_primary = set.primary().port;
    let opts = LockOptions::new(ms(30_000));
    let acked = first.acquire("acked", &opts).await.expect("acknowledged");
    base.named("acked")
        .enter("first", acked.fence())
        .await
        .unwrap();

    set.proxy().unwrap().blackhole();
    let err = first.acquire("unacked", &opts).await.unwrap_err();
    let LockError::NotReplicated {
        acked: 0,
        needed: 1,
        ..
    } = err
    else {
        panic!("{err:?}");
    };
    assert!(err.to_string().contains("only 0 of the 1 replica"), "{err}");
    assert!(
        !exists(old_primary, &first.key_of("unacked")).await,
        "the unacknowledged key was deleted"
    );

    set.kill_primary();
    let new_primary = set.wait_for_failover().await;
    assert_ne!(new_primary, old_primary);

    let second = sentinel_locker(&set, 0).await;
    // The acknowledged lock survived the failover: the second holder is refused.
    let refused = second
        .acquire("acked", &LockOptions::new(ms(30_000)))
        .await
        .unwrap_err();
    assert!(matches!(refused, LockError::Busy { .. }), "{refused:?}");
    // The other one was never held: the second holder gets it, alone.
    let store = base.named("unacked");
    second
        .try_run("unacked", &opts, async |lease| {
            let e = store.enter("second", lease.fence()).await?;
            store.write("second", lease.fence(), e.basis).await?;
            Ok::<_, Failure>(())
        })
        .await
        .unwrap();
    base.named("acked")
        .write("first", acked.fence(), 0)
        .await
        .unwrap();
    for name in ["acked", "unacked"] {
        let report = base.named(name).check().await.unwrap();
        assert!(report.overlaps.is_empty(), "{name}: {report}");
        assert_eq!(report.violations(), 0, "{name}: {report}");
    }
    // The first locker follows the new primary by itself, acknowledged by the other replica
    // (retried within the wait while it resynchronises with the new primary).
    let lease = first
        .acquire("after", &opts.with_wait(ms(15_000)))
        .await
        .expect("the first locker locks on the new primary");
    assert!(exists(new_primary, &first.key_of("after")).await);
    lease.release().await.unwrap();
    drop(acked);
}

/// A master name no Sentinel knows, and `replicas(2)` with one replica, are clear errors at
/// connect; a short acknowledgement at acquire says how many replicas answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_bad_set_ups_are_clear_errors() {
    let _one = SERIAL.lock().await;
    let set = SentinelSet::start().await;
    let err = Locker::builder()
        .sentinel(set.sentinel_urls(), "no-such-master")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    assert_mentions(&err, &["no Sentinel knows", "no-such-master"]);

    let err = sentinel_builder(&set, 2).connect().await.unwrap_err();
    assert_mentions(&err, &["replicas(2)", "has 1 connected replica"]);

    // Built without the check, the shortfall shows at acquire, with the count.
    let locker = sentinel_builder(&set, 2).build().unwrap();
    let err = locker
        .acquire("job", &LockOptions::new(ms(1_000)))
        .await
        .unwrap_err();
    let LockError::NotReplicated {
        acked: 1,
        needed: 2,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    let key = locker.key_of("job");
    assert!(!exists(set.primary().port, &key).await, "deleted again");
}
