//! `fail_open`: while Redis is unreachable, a locked call with the flag runs its body without
//! the lock (one WARN per call), one without it fails with the Redis error and runs nothing; a
//! busy lock is never a reason to run unlocked; once Redis is back the body is locked again.

pub mod support;

use std::sync::atomic::{AtomicUsize, Ordering};

use lock_runtime::{LockError, LockOptions, Locker, distributed_lock};
use lock_testing::RedisServer;
use support::{Env, capture_logs, ms, opts};

static WARM_RUNS: AtomicUsize = AtomicUsize::new(0);
static STRICT_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Whether the lock's key existed while the body ran (`None`: Redis was not reachable to ask).
#[distributed_lock(name = "warm:{shard}", ttl = "2s", fail_open, locker = locker)]
async fn warm_cache(locker: &Locker, url: &str, shard: u32) -> Result<Option<bool>, LockError> {
    WARM_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(key_exists(url, &locker.key_of(&format!("warm:{shard}"))).await)
}

#[distributed_lock(name = "strict:{shard}", ttl = "2s", locker = locker)]
async fn strict_sync(locker: &Locker, shard: u32) -> Result<(), LockError> {
    let _ = (locker, shard);
    STRICT_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// `EXISTS key` on a connection of its own; `None` when the server cannot be reached.
async fn key_exists(url: &str, key: &str) -> Option<bool> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = tokio::time::timeout(ms(500), client.get_multiplexed_async_connection())
        .await
        .ok()?
        .ok()?;
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<bool>(&mut conn)
        .await
        .ok()
}

fn unlocked_warnings(logs: &[String]) -> usize {
    logs.iter()
        .filter(|l| l.starts_with("WARN") && l.contains("runs WITHOUT the lock"))
        .count()
}

async fn a_fail_open_call_runs_unlocked_only_while_redis_is_unreachable() {
    let env = Env::start().await;
    let url = env.server.url();

    // Redis up: locked, and no warning.
    let logs = capture_logs(async {
        assert_eq!(warm_cache(&env.locker, &url, 1).await.unwrap(), Some(true));
    })
    .await;
    assert_eq!(unlocked_warnings(&logs), 0, "{logs:#?}");

    // Busy is never "unreachable": the call fails as without the flag, and the body does not run.
    let holder = env.locker.acquire("warm:1", &opts(5_000)).await.unwrap();
    let runs = WARM_RUNS.load(Ordering::SeqCst);
    let err = warm_cache(&env.locker, &url, 1).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    assert_eq!(WARM_RUNS.load(Ordering::SeqCst), runs);
    holder.release().await.unwrap();

    // Redis down: the fail-open body runs once per call, unlocked, with one warning per call;
    // the strict one is refused with the Redis error and never runs.
    env.server.kill();
    let logs = capture_logs(async {
        for _ in 0..3 {
            assert_eq!(warm_cache(&env.locker, &url, 1).await.unwrap(), None);
        }
        let err = strict_sync(&env.locker, 1).await.unwrap_err();
        assert!(err.is_unreachable(), "{err}");
    })
    .await;
    assert_eq!(WARM_RUNS.load(Ordering::SeqCst), runs + 3);
    assert_eq!(STRICT_RUNS.load(Ordering::SeqCst), 0);
    assert_eq!(unlocked_warnings(&logs), 3, "{logs:#?}");

    // Redis back: once the locker has reconnected, locked again, and no warning.
    env.server.restart();
    support::eventually(ms(5_000), "the locker reconnected", || async {
        match env.locker.acquire("probe", &opts(2_000)).await {
            Ok(lease) => lease.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    let logs = capture_logs(async {
        assert_eq!(warm_cache(&env.locker, &url, 2).await.unwrap(), Some(true));
    })
    .await;
    assert_eq!(unlocked_warnings(&logs), 0, "{logs:#?}");
    strict_sync(&env.locker, 1).await.unwrap();
}

/// One test in this binary: the warning's callsite is registered once per process, and a test
/// running beside the log capture without it would switch the event off for the capture.
#[tokio::test]
async fn fail_open_runs_unlocked_only_while_redis_is_unreachable() {
    a_fail_open_call_runs_unlocked_only_while_redis_is_unreachable().await;
    a_body_run_unlocked_holds_nothing_and_cannot_take_a_lease_by_hand().await;
    redlock_fails_open_without_a_quorum_only().await;
}

/// Redlock of 3: with one server down a majority still locks (no warning); with two down there
/// is no quorum, and the body runs unlocked.
async fn redlock_fails_open_without_a_quorum_only() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let locker = Locker::redlock(servers.iter().map(RedisServer::url))
        .await
        .unwrap();
    let fail_open = opts(2_000).with_fail_open(true);
    let held = async |locker: &Locker| {
        locker
            .run("quorum", &fail_open, async |lease| lease.is_held())
            .await
            .unwrap()
    };
    servers[0].kill();
    let logs = capture_logs(async { assert!(held(&locker).await, "a majority holds it") }).await;
    assert_eq!(unlocked_warnings(&logs), 0, "{logs:#?}");
    servers[1].kill();
    let logs = capture_logs(async { assert!(!held(&locker).await, "no quorum: unlocked") }).await;
    assert_eq!(unlocked_warnings(&logs), 1, "{logs:#?}");
}

async fn a_body_run_unlocked_holds_nothing_and_cannot_take_a_lease_by_hand() {
    let env = Env::start().await;
    let fail_open = opts(2_000).with_fail_open(true);
    // A lease by hand is the lock itself: refused at once, naming the lock.
    let err = env.locker.acquire("by-hand", &fail_open).await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(err.to_string().contains("by-hand"), "{err}");
    // With permits: refused by the rules, as the attribute is at compile time.
    let err = fail_open.with_permits(3).validate().unwrap_err();
    assert!(
        err.to_string()
            .contains("fail_open cannot go with permits = 3"),
        "{err}"
    );

    env.server.kill();
    let seen = env
        .locker
        .run("unlocked", &fail_open, async |lease| {
            (lease.fence(), lease.is_held(), lease.ensure_held().is_err())
        })
        .await
        .unwrap();
    assert_eq!(seen, (0, false, true));
    // Still bounded by max_exec.
    let short = LockOptions::new(ms(2_000))
        .with_max_exec(ms(50))
        .with_fail_open(true);
    let err = env
        .locker
        .run("unlocked", &short, async |lease| {
            let _ = lease.lost().await;
        })
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::MaxExecExceeded { .. }), "{err}");
}
