//! Holding a lock: the watchdog renews the lease while the body runs, and a lost lease (key
//! deleted, Redis frozen, validity or max_exec run out) cancels the body or ends the call as
//! lost.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lock_runtime::{LockError, LostReason};
use support::{
    Env, SleepingBody, acquire_retrying, lost_reason, ms, opts, query, raw_connection, timed,
};
use tokio::time::Instant;

#[tokio::test]
async fn watchdog_renews_while_the_body_runs_and_stops_after() {
    let env = Env::start().await;
    let key = env.key("renewed");
    let o = opts(1_000).with_renew(ms(100));
    let min_pttl = Arc::new(AtomicUsize::new(usize::MAX));
    let sampler = {
        let (raw_env_url, key, min_pttl) = (env.server.url(), key.clone(), min_pttl.clone());
        tokio::spawn(async move {
            let raw = raw_connection(&raw_env_url).await;
            loop {
                let p: i64 = query(&raw, redis::cmd("PTTL").arg(&key)).await;
                if p > 0 {
                    min_pttl.fetch_min(p as usize, Ordering::SeqCst);
                }
                tokio::time::sleep(ms(5)).await;
            }
        })
    };
    env.locker
        .run("renewed", &o, async |_| tokio::time::sleep(ms(800)).await)
        .await
        .unwrap();
    sampler.abort();
    let min = min_pttl.load(Ordering::SeqCst);
    assert!(
        min >= 800,
        "PTTL dropped to {min} ms: the watchdog did not keep it above ttl - 2 x renew"
    );
    // After the end, no renewal is sent any more.
    env.reset_stats().await;
    tokio::time::sleep(ms(350)).await;
    assert_eq!(
        env.calls("evalsha").await,
        0,
        "the watchdog kept renewing an ended lease"
    );
}

#[tokio::test]
async fn key_deleted_by_someone_else_cancels_the_body_with_lost() {
    let env = Env::start().await;
    let key = env.key("stolen");
    let o = opts(10_000).with_renew(ms(100));
    let (body, _) = SleepingBody::start(&env.locker, "stolen", o).await;
    env.del(&key).await;
    let (res, took) = body.cut_short().await;
    assert_eq!(lost_reason(&res), Some(LostReason::NotOwner), "{res:?}");
    assert!(
        took <= ms(100 + 100),
        "loss noticed after {took:?}, more than one renew period + a round trip"
    );
}

/// Records when it is dropped: the moment the body was cancelled.
struct DropClock(Arc<std::sync::Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

#[tokio::test]
async fn frozen_redis_cancels_the_body_before_validity_ends_and_locker_recovers() {
    let env = Env::start().await;
    // max_exec defaults to ttl - drift, counted from the body's start; validity counts from
    // when the acquire was sent, so here the lease's validity is the earlier bound.
    let o = opts(600).with_renew(ms(100));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let cancelled = Arc::new(std::sync::Mutex::new(None));
    let run = {
        let (locker, cancelled) = (env.locker.clone(), cancelled.clone());
        tokio::spawn(async move {
            locker
                .run("frozen", &o, async |lease| {
                    let _clock = DropClock(cancelled);
                    started_tx.send((Instant::now(), lease.deadline())).unwrap();
                    tokio::time::sleep(ms(5_000)).await;
                })
                .await
        })
    };
    let (body_start, validity) = started_rx.await.unwrap();
    env.server.pause();
    let res = run.await.unwrap();
    env.server.resume();
    assert_eq!(
        lost_reason(&res),
        Some(LostReason::ValidityExpired),
        "a body under a frozen Redis must end with Lost, got {res:?}"
    );
    let bound = (body_start + o.max_exec()).min(validity);
    let at = cancelled.lock().unwrap().expect("the body was dropped");
    assert!(
        at <= bound + ms(20),
        "body cancelled {:?} after the bound",
        at - bound
    );
    // The same locker works again once Redis is back.
    let lease = acquire_retrying(&env.locker, "after-freeze", &opts(1_000), |_| true)
        .await
        .expect("the locker recovers after SIGCONT");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn max_exec_cancels_the_body_at_its_deadline_and_releases() {
    let env = Env::start().await;
    let o = opts(2_000).with_max_exec(ms(200));
    let call = env
        .locker
        .run("slow", &o, async |_| tokio::time::sleep(ms(5_000)).await);
    let (res, took) = timed(call).await;
    assert!(
        matches!(res, Err(LockError::MaxExecExceeded { .. })),
        "{res:?}"
    );
    assert!(
        took >= ms(200) && took <= ms(200 + 20 + 5),
        "cancelled after {took:?}"
    );
    assert!(
        !env.exists(&env.key("slow")).await,
        "the key must be released at once"
    );
}

/// A body that blocks its thread past the lease's validity finishes without the lock: the call
/// reports the lease lost, not `Ok`.
#[tokio::test(flavor = "current_thread")]
async fn a_body_that_finishes_after_its_lease_ran_out_is_lost_not_ok() {
    let env = Env::start().await;
    let res = env
        .locker
        .run("blocked", &opts(200), async |_| {
            // Blocks the only runtime thread: no renewal and no timer can run meanwhile.
            std::thread::sleep(ms(400));
            42
        })
        .await;
    assert_eq!(
        lost_reason(&res),
        Some(LostReason::ValidityExpired),
        "{res:?}"
    );
}
