//! A locked call says when its lock did not protect it: a key found gone at release is `Lost`,
//! a body that blocked past `max_exec` is `MaxExecExceeded`; and limits are errors or "as long
//! as it takes", never panics.
//!
//! The tests of this file that log take `SERIAL`: a log capture sees every event only while no
//! other test of the process reaches the same log lines at the same time.

use crate::support;

use std::time::Duration;

use lock_runtime::{LockError, LockOptions, LostReason};
use support::{
    Env, SERIAL, assert_mentions, capture_logs, cycle, eventually, lost_reason, ms, opts, within,
};

/// ttl 30 s, the key deleted 0.2 s into the body (before any renewal): the call returns
/// `Lost`, and no log line claims the key expires by its ttl or that the body was cancelled.
// One thread: the log capture is per thread.
#[tokio::test]
async fn a_key_deleted_under_the_body_is_reported_lost_at_release() {
    let _alone = SERIAL.lock().await;
    let env = Env::start().await;
    let key = env.key("job");
    let mut out = None;
    let logs = capture_logs(async {
        out = Some(
            env.locker
                .run("job", &LockOptions::new(ms(30_000)), async |_| {
                    tokio::time::sleep(ms(200)).await;
                    env.del(&key).await;
                    tokio::time::sleep(ms(300)).await;
                    "done"
                })
                .await,
        );
    })
    .await;
    match out.unwrap() {
        Err(LockError::Lost { reason, .. }) => assert_eq!(reason, LostReason::GoneAtRelease),
        other => panic!("{other:?}"),
    }
    let logs = logs.join("\n");
    assert!(logs.contains("release found the key no longer"), "{logs}");
    for false_claim in [
        "expires by its ttl",
        "body is cancelled",
        "body was cancelled",
    ] {
        assert!(!logs.contains(false_claim), "{false_claim}: {logs}");
    }
    // The error says what happened to the body.
    let err = env
        .locker
        .run("job", &LockOptions::new(ms(30_000)), async |_| {
            env.del(&key).await;
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("run to its end, partly without the lock"),
        "{err}"
    );
}

/// The same key taken over by another locker meanwhile: `Lost`, and the new holder's key is
/// left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_taken_over_under_the_body_is_lost_and_the_new_holder_keeps_it() {
    let _alone = SERIAL.lock().await;
    let env = Env::start().await;
    let key = env.key("job");
    let other = env.second_locker().await;
    let opts = LockOptions::new(ms(30_000));
    let mut taker = None;
    let out = env
        .locker
        .run("job", &opts, async |_| {
            env.del(&key).await;
            taker = Some(other.acquire("job", &opts).await.unwrap());
        })
        .await;
    assert_eq!(
        lost_reason(&out),
        Some(LostReason::GoneAtRelease),
        "{out:?}"
    );
    let taker = taker.unwrap();
    assert!(env.get(&key).await.is_some_and(|v| v == taker.token()));
    taker.release().await.unwrap();
}

/// A manual release of a lease whose key is gone says so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_release_of_a_gone_key_is_lost() {
    let _alone = SERIAL.lock().await;
    let env = Env::start().await;
    let lease = env.locker.acquire("job", &opts(30_000)).await.unwrap();
    env.del(&env.key("job")).await;
    let released = lease.release().await;
    assert_eq!(
        lost_reason(&released),
        Some(LostReason::GoneAtRelease),
        "{released:?}"
    );
}

/// Redis killed while the body runs, after a renewal went through: whether `max_exec` ends the
/// body (default options, ttl 3 s: the renewal carried the validity past it) or the lease's
/// validity does (a lease of 1 s), the call is `Lost` because the servers could not be reached,
/// with the Redis error as its source; the first failed renewal is logged once, at WARN, with
/// that error, however often it is retried.
// One thread: the log capture is per thread.
#[tokio::test]
async fn redis_killed_under_the_body_is_lost_as_unreachable_with_the_redis_error() {
    let _alone = SERIAL.lock().await;
    let with_lease = LockOptions::new(ms(10_000)).with_lease(ms(1_000));
    for o in [LockOptions::new(ms(3_000)), with_lease] {
        let env = Env::start().await;
        let mut out = None;
        let logs = capture_logs(async {
            let body = async |lease: &lock_runtime::Lease| {
                let first = lease.deadline();
                eventually(ms(5_000), "a renewal is confirmed", || async {
                    lease.deadline() > first
                })
                .await;
                env.server.kill();
                tokio::time::sleep(ms(10_000)).await;
            };
            out = Some(env.locker.run("down", &o, body).await);
        })
        .await;
        assert_unreachable(&out.unwrap().unwrap_err());
        let warned: Vec<&String> = logs
            .iter()
            .filter(|l| l.contains("renewal failed") && !l.starts_with("DEBUG"))
            .collect();
        assert!(
            warned.len() == 1 && warned[0].starts_with("WARN") && warned[0].contains("\"down\""),
            "{o:?}: {warned:#?}"
        );
    }
}

/// The same for a lease taken by hand: `Lease::lost` says the servers could not be reached, and
/// `Lease::ensure_held` returns the error, with the Redis error as its source.
#[tokio::test]
async fn a_lease_whose_redis_was_killed_is_lost_as_unreachable() {
    // It logs what the test above captures.
    let _alone = SERIAL.lock().await;
    let env = Env::start().await;
    let o = LockOptions::new(ms(10_000)).with_lease(ms(1_000));
    let lease = env.locker.acquire("down", &o).await.unwrap();
    let first = lease.deadline();
    eventually(ms(5_000), "a renewal is confirmed", || async {
        lease.deadline() > first
    })
    .await;
    assert!(lease.ensure_held().is_ok());
    env.server.kill();
    let reason = tokio::time::timeout(ms(5_000), lease.lost())
        .await
        .expect("lost within its validity");
    assert_eq!(reason, LostReason::Unreachable);
    assert_unreachable(&lease.ensure_held().unwrap_err());
}

/// `err` is `Lost` because the servers could not be reached, with the Redis error as its source.
fn assert_unreachable(err: &LockError) {
    assert!(
        matches!(
            err,
            LockError::Lost {
                reason: LostReason::Unreachable,
                ..
            }
        ),
        "{err:?}"
    );
    let source = std::error::Error::source(err).expect("the Redis error as the source");
    assert!(
        source.downcast_ref::<redis::RedisError>().is_some(),
        "{source:?}"
    );
    assert_mentions(err, &["could not be reached", "up and reachable"]);
}

/// A body that blocks its thread past `max_exec` and returns without another `.await` is
/// reported as having run too long, on either runtime.
#[test]
fn a_body_blocking_past_max_exec_is_reported_on_every_runtime() {
    for multi_thread in [true, false] {
        let runtime = if multi_thread {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .unwrap();
        runtime.block_on(async {
            let env = Env::start().await;
            let opts = LockOptions::new(ms(2_000)).with_max_exec(ms(300));
            let out = env
                .locker
                .run("job", &opts, async |_| {
                    tokio::task::yield_now().await;
                    std::thread::sleep(ms(500));
                    "done"
                })
                .await;
            assert!(
                matches!(out, Err(LockError::MaxExecExceeded { .. })),
                "multi_thread {multi_thread}: {out:?}"
            );
            // And without any `.await` at all.
            let out = env
                .locker
                .run("job", &opts, async |_| {
                    std::thread::sleep(ms(500));
                })
                .await;
            assert!(
                matches!(out, Err(LockError::MaxExecExceeded { .. })),
                "multi_thread {multi_thread}, no await: {out:?}"
            );
            // The lock was released all the same.
            assert!(!env.exists(&env.key("job")).await);
        });
    }
}

/// A very large wait is a wait as long as it takes: on a free lock and on a busy one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_wait_waits_as_long_as_it_takes() {
    let env = Env::start().await;
    let forever = LockOptions::new(ms(5_000)).with_wait(Duration::MAX);
    cycle(&env.locker, "job", &forever).await;
    let held = env.locker.acquire("job", &opts(5_000)).await.unwrap();
    let other = env.second_locker().await;
    let waiter = tokio::spawn(async move { other.acquire("job", &forever).await.map(drop) });
    tokio::time::sleep(ms(200)).await;
    held.release().await.unwrap();
    within(ms(5_000), waiter, "the waiter gets the lock")
        .await
        .unwrap();
}

/// A ttl Redis cannot take is a `Config` error from `validate()`, before any request.
#[tokio::test]
async fn a_ttl_redis_cannot_take_is_a_config_error() {
    let year = Duration::from_secs(365 * 86_400);
    for ttl in [
        Duration::MAX,
        300_000_000 * year,
        Duration::from_millis(u64::MAX),
        101 * year,
    ] {
        let err = LockOptions::new(ttl).validate().unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{ttl:?}: {err}");
    }
    let err = LockOptions::new(101 * year)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("ttl") && err.contains("too long"), "{err}");
    assert!(LockOptions::new(100 * year).validate().is_ok());
}
