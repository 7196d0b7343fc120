//! Inspection: who holds a lock, its fence and time left, its waiters in order; the states a key
//! can be in; `list` over many names; Redlock's majority view.

pub mod support;

use lock_runtime::{LockOptions, LockState, Locker};
use support::{Env, cycle, eventually, ms, query, raw_connection};

/// Another locker on the server of `env`, labelled `label`.
async fn labelled(env: &Env, label: &str) -> Locker {
    env.locker_with(|b| b.label(label)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_holder_its_fence_and_the_waiters_in_order() {
    let env = Env::start().await;
    assert_eq!(env.locker.inspect("report").await.unwrap(), None);
    let holder = labelled(&env, "holder").await;
    // A first lease, released: its fence is recorded in the counter.
    let before = holder
        .acquire("report", &LockOptions::new(ms(10_000)))
        .await
        .unwrap();
    let recorded = before.fence();
    before.release().await.unwrap();
    let lease = holder
        .acquire("report", &LockOptions::new(ms(10_000)))
        .await
        .unwrap();

    // Two waiters queue, in this order.
    let mut waiters = Vec::new();
    for label in ["w1", "w2"] {
        let locker = labelled(&env, label).await;
        waiters.push(tokio::spawn(async move {
            let opts = LockOptions::new(ms(10_000)).with_wait(ms(10_000));
            cycle(&locker, "report", &opts).await
        }));
        eventually(ms(5_000), "the waiter queued", || async {
            let info = env.locker.inspect("report").await.unwrap().unwrap();
            info.waiters
                .iter()
                .any(|w| w.holder.as_ref().and_then(|h| h.label.as_deref()) == Some(label))
        })
        .await;
    }
    let info = env.locker.inspect("report").await.unwrap().unwrap();
    assert_eq!(info.key, env.key("report"));
    assert_eq!(info.state, LockState::Held);
    let h = info.holder.as_ref().unwrap();
    assert_eq!(
        (h.pid, h.label.as_deref()),
        (std::process::id(), Some("holder"))
    );
    assert!(lease.token().starts_with(&h.token));
    // The waiters queued behind the holder set the mark at the end of its value.
    let unmarked = lease.token().strip_suffix(";w=0").unwrap();
    assert_eq!(info.value, format!("{unmarked};w=1"));
    // The last fence recorded is the released lease's; the holder's own is above it.
    assert_eq!(info.fence, Some(recorded));
    assert!(lease.fence() > recorded);
    let ttl = info.ttl_left.unwrap();
    assert!(ttl > ms(5_000) && ttl <= ms(10_000), "{ttl:?}");
    let order: Vec<Option<&str>> = info
        .waiters
        .iter()
        .map(|w| w.holder.as_ref().and_then(|h| h.label.as_deref()))
        .collect();
    assert_eq!(order, [Some("w1"), Some("w2")]);

    lease.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(env.locker.inspect("report").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_tells_min_hold_and_foreign_values_apart() {
    let env = Env::start().await;
    let opts = LockOptions::new(ms(5_000)).with_min_hold(ms(2_000));
    env.locker.run("tick", &opts, async |_| ()).await.unwrap();
    let info = env.locker.inspect("tick").await.unwrap().unwrap();
    assert_eq!(info.state, LockState::MinHold);
    assert_eq!(info.holder.unwrap().pid, std::process::id());

    // A value this library did not write (another client on the same key).
    let foreign = redis::cmd("SET")
        .arg(env.key("python"))
        .arg("6f1c2d3e-aaaa-bbbb-cccc-0123456789ab")
        .arg("EX")
        .arg(10)
        .clone();
    let () = query(&env.raw, &foreign).await;
    let info = env.locker.inspect("python").await.unwrap().unwrap();
    assert_eq!(info.state, LockState::Foreign);
    assert_eq!(info.holder, None);
    assert_eq!(info.value, "6f1c2d3e-aaaa-bbbb-cccc-0123456789ab");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_finds_the_held_locks_by_pattern_and_nothing_else() {
    let env = Env::start().await;
    let opts = LockOptions::new(ms(10_000));
    let mut leases = Vec::new();
    for n in ["invoice:1", "invoice:2", "invoice:3", "report:a"] {
        leases.push(env.locker.acquire(n, &opts).await.unwrap());
    }
    // Released: its fence counter stays, but it is not held.
    cycle(&env.locker, "invoice:9", &opts).await;
    let names =
        |infos: Vec<lock_runtime::LockInfo>| infos.into_iter().map(|i| i.name).collect::<Vec<_>>();
    assert_eq!(
        names(env.locker.list("*").await.unwrap()),
        ["invoice:1", "invoice:2", "invoice:3", "report:a"]
    );
    assert_eq!(
        names(env.locker.list("invoice:*").await.unwrap()),
        ["invoice:1", "invoice:2", "invoice:3"]
    );
    assert!(env.locker.list("nothing*").await.unwrap().is_empty());
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert!(env.locker.list("*").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_on_redlock_reports_the_majority_value() {
    let nodes = support::nodes::Nodes::start(3);
    let locker = Locker::builder()
        .urls(nodes.urls())
        .label("redlock")
        .connect()
        .await
        .unwrap();
    let lease = locker
        .acquire("job", &LockOptions::new(ms(10_000)))
        .await
        .unwrap();
    // The acquire returned once a majority granted it; the third node's grant may land a little
    // later (a loaded machine delays its server). Only then does one node's loss leave a majority.
    let key = locker.key_of("job");
    eventually(ms(2_000), "every node holds the key", || {
        let (nodes, key, token) = (&nodes, &key, lease.token());
        async move {
            for i in 0..3 {
                if nodes.get(i, key).await.as_deref() != Some(token) {
                    return false;
                }
            }
            true
        }
    })
    .await;
    // One node loses the key: the majority still holds it.
    let first = raw_connection(&nodes.urls()[0]).await;
    let _: i64 = query(&first, redis::cmd("DEL").arg(locker.key_of("job"))).await;
    let info = locker.inspect("job").await.unwrap().unwrap();
    assert_eq!(info.value, lease.token());
    assert_eq!(info.holder.unwrap().label.as_deref(), Some("redlock"));
    assert!(
        locker
            .list("*")
            .await
            .unwrap()
            .iter()
            .any(|i| i.name == "job")
    );
    // Released by force with the value shown: gone on every node.
    assert!(locker.force_release("job", &info.value).await.unwrap());
    assert_eq!(locker.inspect("job").await.unwrap(), None);
    assert!(!locker.force_release("job", &info.value).await.unwrap());
}

/// The key's value, read straight from Redis (not through `inspect`), names this process and the
/// locker's label, with the label's spaces and separators made safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_stored_in_the_key_names_this_process_and_its_label() {
    let env = Env::start().await;
    let locker = labelled(&env, "billing worker;#2").await;
    let lease = locker
        .acquire("invoice:7", &LockOptions::new(ms(10_000)))
        .await
        .unwrap();
    let stored = env
        .get(&env.key("invoice:7"))
        .await
        .expect("the key is set");
    assert_eq!(stored, lease.token(), "Lease::token is the whole value");
    let (token, identity) = stored.split_at(22);
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{stored}"
    );
    assert!(
        identity.contains(&format!(";p={};", std::process::id())),
        "{stored}"
    );
    assert!(identity.ends_with(";l=billing_worker__2;w=0"), "{stored}");
    assert!(identity.starts_with(";h="), "{stored}");
    assert!(!stored.contains(' '), "{stored}");
    lease.release().await.unwrap();
    // Every acquisition draws a fresh token; the identity stays.
    let again = locker
        .acquire("invoice:7", &LockOptions::new(ms(10_000)))
        .await
        .unwrap();
    assert_ne!(&again.token()[..32], token);
    assert!(again.token().ends_with(identity));
    again.release().await.unwrap();
}
