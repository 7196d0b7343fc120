//! Several names at once (`Locker::acquire_all`, `Locker::run_all`): all or nothing, in one
//! global order, so that two processes transferring between the same accounts in opposite
//! directions never deadlock and conserve the total; a holder killed while it waits for its
//! second name leaves its first one held no longer than its lease.

use crate::support;

use lock_runtime::{LockError, LostReason, distributed_lock};
use lock_testing::RedisServer;
use support::holder::{Holder, field};
use support::{Env, eventually, ms, opts};

/// Both accounts' fences, seen inside the body, and whether both keys existed then.
#[distributed_lock(
    name = ["acct:{from}", "acct:{to}"],
    ttl = "2s",
    wait = "5s",
    locker = env.locker,
    guard = leases
)]
async fn move_one(env: &Env, from: &str, to: &str) -> Result<(Vec<u64>, bool), LockError> {
    let held = env.exists(&env.key(&format!("acct:{from}"))).await
        && env.exists(&env.key(&format!("acct:{to}"))).await;
    Ok((leases.iter().map(|l| l.fence()).collect(), held))
}

async fn balance(store: &redis::aio::MultiplexedConnection, account: &str) -> i64 {
    let mut conn = store.clone();
    redis::cmd("GET")
        .arg(format!("{{account:{account}}}:balance"))
        .query_async::<Option<i64>>(&mut conn)
        .await
        .unwrap()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_transfers_neither_deadlock_nor_lose_a_unit() {
    let env = Env::start().await;
    let store = RedisServer::start();
    let raw = support::raw_connection(&store.url()).await;
    let mut conn = raw.clone();
    for account in ["a", "b"] {
        let _: () = redis::cmd("SET")
            .arg(format!("{{account:{account}}}:balance"))
            .arg(1_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let transfer = |from: &str, to: &str| {
        let args = [
            ("redis", env.server.url()),
            ("store", store.url()),
            ("from", from.to_owned()),
            ("to", to.to_owned()),
            ("count", "1000".to_owned()),
            ("ttl", "5000".to_owned()),
            ("wait", "10000".to_owned()),
        ];
        Holder::spawn("transfer", &args)
    };
    let mut there = transfer("a", "b");
    let mut back = transfer("b", "a");
    for side in [&mut there, &mut back] {
        let done = side.expect("done", ms(60_000)).await;
        assert_eq!(field(&done, "transfers"), "1000", "{done}");
        assert_eq!(field(&done, "refused"), "0", "{done}");
    }
    assert_eq!(balance(&raw, "a").await, 1_000);
    assert_eq!(balance(&raw, "b").await, 1_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_while_it_waits_for_its_second_name_frees_the_first() {
    let env = Env::start().await;
    let store = RedisServer::start();
    // The test holds `account:y`; the process takes `account:x` (first in the global order)
    // and waits for `y`.
    let held = env.locker.acquire("account:y", &opts(5_000)).await.unwrap();
    let args = [
        ("redis", env.server.url()),
        ("store", store.url()),
        ("from", "y".to_owned()),
        ("to", "x".to_owned()),
        ("count", "1".to_owned()),
        ("ttl", "1000".to_owned()),
        ("wait", "20000".to_owned()),
    ];
    let mut holder = Holder::spawn("transfer", &args);
    holder.expect("ready", ms(5_000)).await;
    eventually(
        ms(5_000),
        "x held by the process, which waits for y",
        || async {
            let x = env.locker.inspect("account:x").await.unwrap();
            let y = env.locker.inspect("account:y").await.unwrap();
            x.is_some_and(|x| x.holder.is_some_and(|h| h.pid == holder.pid()))
                && y.is_some_and(|y| !y.waiters.is_empty())
        },
    )
    .await;
    holder.kill();
    // Its lease of x (1 s) runs out: x is free again without anyone releasing it.
    let killed = tokio::time::Instant::now();
    eventually(ms(3_000), "x freed by its lease", || async {
        env.locker.inspect("account:x").await.unwrap().is_none()
    })
    .await;
    eprintln!("x free {:?} after the kill", killed.elapsed());
    held.release().await.unwrap();
    let both = env
        .locker
        .acquire_all(
            &["account:x", "account:y"],
            &opts(2_000).with_wait(ms(5_000)),
        )
        .await
        .unwrap();
    assert_eq!(both.len(), 2);
}

#[tokio::test]
async fn all_or_nothing_in_the_order_given() {
    let env = Env::start().await;
    // Given in any order, returned in that order; each with its own fence.
    let leases = env
        .locker
        .acquire_all(&["n:2", "n:1", "n:3"], &opts(2_000))
        .await
        .unwrap();
    let names: Vec<&str> = leases.iter().map(|l| l.name()).collect();
    assert_eq!(names, ["n:2", "n:1", "n:3"]);
    // One of them busy: none taken, the busy one named, the others released at once.
    let err = env
        .locker
        .acquire_all(&["n:0", "n:3"], &opts(2_000))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LockError::Busy { name, .. } if name == "n:3"),
        "{err}"
    );
    assert!(!env.exists(&env.key("n:0")).await);
    for lease in leases {
        lease.release().await.unwrap();
    }
    // The same lock twice is a Config error naming both.
    let err = env
        .locker
        .acquire_all(&["n:1", "n:1"], &opts(2_000))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(err.to_string().contains("the same lock"), "{err}");
}

#[tokio::test]
async fn a_body_under_several_names_stops_when_any_is_lost_and_releases_all() {
    let env = Env::start().await;
    let names = ["pair:1", "pair:2"];
    let fences = env
        .locker
        .run_all(&names, &opts(2_000), async |leases| {
            leases.iter().map(|l| l.fence()).collect::<Vec<_>>()
        })
        .await
        .unwrap();
    assert!(fences.iter().all(|&f| f > 0));
    assert!(!env.exists(&env.key("pair:1")).await && !env.exists(&env.key("pair:2")).await);

    let err = env
        .locker
        .run_all(&names, &opts(2_000), async |leases| {
            env.del(&env.key("pair:2")).await;
            // Cancelled here, when the loss of pair:2 is found.
            let _ = leases[1].lost().await;
            tokio::time::sleep(ms(10_000)).await;
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LockError::Lost { name, reason: LostReason::NotOwner, .. } if name == "pair:2"),
        "{err}"
    );
    eventually(ms(2_000), "pair:1 released", || async {
        !env.exists(&env.key("pair:1")).await
    })
    .await;
}

#[tokio::test]
async fn the_attribute_takes_every_name_of_its_array() {
    let env = Env::start().await;
    let (fences, held) = move_one(&env, "1", "2").await.unwrap();
    assert!(held, "both keys held inside the body");
    assert_eq!(fences.len(), 2);
    assert!(fences.iter().all(|&f| f > 0), "{fences:?}");
    assert!(!env.exists(&env.key("acct:1")).await && !env.exists(&env.key("acct:2")).await);
    // Two names that render the same: refused, nothing taken.
    let err = move_one(&env, "3", "3").await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(!env.exists(&env.key("acct:3")).await);
}
