//! Releasing a lock: the uncontended release's commands, min_hold keeping the key after an
//! early return, and a stale holder never touching the new holder's key. Release on every
//! return path is a case of `behaviour.rs`, run on every deployment.

use crate::support;

use lock_runtime::{LockError, LostReason};
use support::monitor::Monitor;
use support::{Env, cycle, eventually, lost_reason, ms, opts};
use tokio::time::Instant;

/// An uncontended release is one EVALSHA of the short release script: GET and DEL, with no look
/// at the queue (a waiter would have marked the value). Without a fence to record it sends the
/// lock's key and the token alone; a release that records its fence also declares the counter,
/// sends the retention and the fence, and reads and raises the counter.
#[tokio::test]
async fn an_uncontended_release_takes_the_shortest_path() {
    let env = Env::start().await;
    let week = (7 * 24 * 3_600_000u64).to_string();
    // Warm up: the first release loads its script.
    cycle(&env.locker, "short", &opts(5_000)).await;
    let key = env.key("short");
    for fenced in [false, true] {
        let monitor = Monitor::start(env.server.addr());
        let o = if fenced {
            opts(5_000)
        } else {
            lock_runtime::__private::without_fence(opts(5_000))
        };
        let lease = env.locker.acquire("short", &o).await.unwrap();
        let (token, fence) = (lease.token().to_owned(), lease.fence());
        lease.release().await.unwrap();
        eventually(ms(2_000), "the release's DEL is seen", || async {
            monitor.commands().iter().any(|c| c.args[0] == "DEL")
        })
        .await;
        let commands = monitor.commands();
        let scripts: Vec<_> = commands
            .iter()
            .filter(|c| !c.in_script && c.args[0].eq_ignore_ascii_case("EVALSHA"))
            .collect();
        assert_eq!(scripts.len(), 1, "fenced {fenced}: {commands:?}");
        let args = &scripts[0].args[2..];
        if fenced {
            // The key and the counter, then the token, the retention (the locker's default, 7
            // days) and the fence to record.
            let expected = ["2".to_owned(), key.clone(), format!("{key}:fence"), token];
            assert_eq!(args[..4], expected, "fenced {fenced}");
            assert_eq!(
                args[4..],
                [week.clone(), fence.to_string()],
                "fenced {fenced}"
            );
        } else {
            assert_eq!(
                args,
                ["1".to_owned(), key.clone(), token],
                "fenced {fenced}"
            );
        }
        let inner: Vec<_> = commands
            .iter()
            .filter(|c| c.in_script)
            .map(|c| c.args[0].as_str())
            .collect();
        if fenced {
            // No look at the queue: nobody marked the value, so nobody queued behind it. The
            // counter is read first: it is only ever raised, and only when it is a counter.
            assert_eq!(inner, ["GET", "GET", "SET", "DEL"], "records the fence");
        } else {
            assert_eq!(inner, ["GET", "DEL"], "the shortest path");
        }
    }
}

#[tokio::test]
async fn stale_holder_never_touches_the_new_holders_key() {
    let env = Env::start().await;
    let key = env.key("stale");
    for round in 0..100 {
        // A: long ttl, fast renewal, so its watchdog tries to renew right after the takeover.
        let a = env
            .locker
            .acquire("stale", &opts(60_000).with_renew(ms(5)))
            .await
            .unwrap();
        env.del(&key).await; // A's key expires (simulated).
        let b = env.locker.acquire("stale", &opts(10_000)).await.unwrap();
        assert!(b.fence() > a.fence());
        // A's watchdog notices at its next renewal and does not extend B's key.
        tokio::time::timeout(ms(2_000), a.lost())
            .await
            .expect("A learns it lost the lock");
        let released = a.release().await;
        assert_eq!(
            lost_reason(&released),
            Some(LostReason::NotOwner),
            "round {round}: A's release must fail: {released:?}"
        );
        assert_eq!(
            env.get(&key).await.as_deref(),
            Some(b.token()),
            "round {round}: B's key was touched"
        );
        assert!(
            env.pttl(&key).await <= 10_000,
            "round {round}: B's key was extended by A"
        );
        b.release().await.unwrap();
    }
}

async fn env_exists_not(env: &Env, key: &str) -> bool {
    !env.exists(key).await
}

#[tokio::test]
async fn min_hold_keeps_the_key_after_an_early_return() {
    let env = Env::start().await;
    let key = env.key("job");
    let o = opts(2_000).with_min_hold(ms(400));
    let start = Instant::now();
    env.locker.run("job", &o, async |_| ()).await.unwrap();
    assert!(
        env.exists(&key).await,
        "the key stays after an early return"
    );
    let pttl = env.pttl(&key).await;
    assert!(
        pttl > 0 && pttl <= 400,
        "PTTL {pttl} must be the rest of min_hold"
    );
    eventually(ms(1_000), "the key expires after min_hold", || {
        env_exists_not(&env, &key)
    })
    .await;
    assert!(
        start.elapsed() >= ms(400),
        "gone after {:?}, before min_hold",
        start.elapsed()
    );
    // Another caller is refused while min_hold lasts.
    env.locker.run("job", &o, async |_| ()).await.unwrap();
    let err = env.locker.run("job", &o, async |_| ()).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
}
