//! Inspection: who holds a lock, its fence and time left, its waiters in order; the states a key
//! can be in; `list` over many names; Redlock's majority view.

use crate::support;

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

/// Three holders of a lock with 3 permits, each from a locker of its own label.
async fn three_permit_holders(env: &Env, name: &str) -> Vec<lock_runtime::Lease> {
    // Renewed every second: a holder whose permit is taken away learns it soon.
    let o = LockOptions::new(ms(3_000)).with_permits(3);
    let mut leases = Vec::new();
    for label in ["p0", "p1", "p2"] {
        let locker = labelled(env, label).await;
        leases.push(locker.acquire(name, &o).await.unwrap());
    }
    leases
}

/// `(permit, label, value)` of each holder `info` shows.
fn permit_holders(info: &lock_runtime::LockInfo) -> Vec<(Option<u32>, String, String)> {
    info.holders
        .iter()
        .map(|h| {
            assert!(!h.shared, "{h:?}");
            let label = h.holder.as_ref().and_then(|h| h.label.clone());
            (h.permit, label.unwrap_or_default(), h.value.clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_permit_holder_is_shown_and_the_lock_is_listed_once() {
    let env = Env::start().await;
    let leases = three_permit_holders(&env, "pool").await;
    let plain = env
        .locker
        .acquire("plain", &LockOptions::new(ms(10_000)))
        .await
        .unwrap();

    let info = env.locker.inspect("pool").await.unwrap().unwrap();
    assert_eq!(info.permits, Some(3));
    assert_eq!(info.state, LockState::Held);
    // Each takes the first free permit, so the holders are in the order they came.
    let expected: Vec<_> = leases
        .iter()
        .zip(0..)
        .map(|(l, i)| (Some(i), format!("p{i}"), l.token().to_owned()))
        .collect();
    assert_eq!(permit_holders(&info), expected);
    for h in &info.holders {
        assert_eq!(h.holder.as_ref().unwrap().pid, std::process::id());
        assert_eq!(h.fence, None, "the counter does not tell a permit's fence");
        let ttl = h.ttl_left.unwrap();
        assert!(ttl > ms(1_000) && ttl <= ms(3_000), "{ttl:?}");
    }
    // The lock's own fields describe the first holder.
    assert_eq!(info.value, leases[0].token());
    assert_eq!(info.holder.as_ref().unwrap().label.as_deref(), Some("p0"));
    assert!(info.fence >= Some(leases[2].fence()), "{info:?}");
    // An exclusive lock shows its one holder the same way.
    let one = env.locker.inspect("plain").await.unwrap().unwrap();
    assert_eq!((one.permits, one.holders.len()), (None, 1));
    assert_eq!(one.holders[0].value, plain.token());
    assert_eq!(
        (one.holders[0].permit, one.holders[0].shared),
        (None, false)
    );

    let names = |infos: Vec<lock_runtime::LockInfo>| -> Vec<String> {
        infos.into_iter().map(|i| i.name).collect()
    };
    assert_eq!(
        names(env.locker.list("*").await.unwrap()),
        ["plain", "pool"]
    );
    assert_eq!(names(env.locker.list("po*").await.unwrap()), ["pool"]);
    let listed = env.locker.list("pool").await.unwrap();
    assert_eq!(listed[0].holders.len(), 3);

    // Plain keys: the permits' keys are outside the prefix, and found all the same.
    let plain_keys = env
        .locker_with(|b| b.key_format(lock_runtime::KeyFormat::Plain))
        .await;
    let o = LockOptions::new(ms(10_000)).with_permits(2);
    let outside = plain_keys.acquire("plain-pool", &o).await.unwrap();
    let found = plain_keys.list("plain-*").await.unwrap();
    assert_eq!(names(found.clone()), ["plain-pool"]);
    assert_eq!(found[0].holders[0].value, outside.token());
    outside.release().await.unwrap();

    for lease in leases {
        lease.release().await.unwrap();
    }
    // The last permit out frees the lock's key of its mark: the name is free for any mode.
    assert!(!env.exists(&env.key("pool")).await);
    assert_eq!(env.locker.inspect("pool").await.unwrap(), None);
    assert_eq!(names(env.locker.list("*").await.unwrap()), ["plain"]);
    plain.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_permit_holders_value_frees_that_permit_only() {
    let env = Env::start().await;
    let leases = three_permit_holders(&env, "pool").await;
    let info = env.locker.inspect("pool").await.unwrap().unwrap();
    let victim = info.holders[1].clone();
    assert_eq!(victim.value, leases[1].token());

    // A value no permit holds (and not the lock's key either) deletes nothing.
    assert!(!env.locker.force_release("pool", "nobody").await.unwrap());
    let unchanged = env.locker.inspect("pool").await.unwrap().unwrap();
    assert_eq!(permit_holders(&unchanged), permit_holders(&info));
    // A caller waiting for a permit is told when one is freed.
    let waiter = labelled(&env, "p3").await;
    let waiting = tokio::spawn(async move {
        let o = LockOptions::new(ms(3_000))
            .with_permits(3)
            .with_wait(ms(10_000));
        waiter.acquire("pool", &o).await.unwrap()
    });

    assert!(
        env.locker
            .force_release("pool", &victim.value)
            .await
            .unwrap()
    );
    let lost = tokio::time::timeout(ms(5_000), leases[1].lost()).await;
    assert_eq!(lost.unwrap(), lock_runtime::LostReason::NotOwner);
    assert!(leases[0].is_held() && leases[2].is_held());
    let taken = tokio::time::timeout(ms(10_000), waiting)
        .await
        .unwrap()
        .unwrap();
    let after = env.locker.inspect("pool").await.unwrap().unwrap();
    let labels: Vec<_> = permit_holders(&after)
        .into_iter()
        .map(|(permit, label, _)| (permit, label))
        .collect();
    assert_eq!(
        labels,
        [
            (Some(0), "p0".to_owned()),
            (Some(1), "p3".to_owned()),
            (Some(2), "p2".to_owned())
        ]
    );
    assert_eq!(after.holders[1].value, taken.token());
    // The value released by force is nowhere now: a second try deletes nothing.
    assert!(
        !env.locker
            .force_release("pool", &victim.value)
            .await
            .unwrap()
    );
    assert_eq!(
        env.locker
            .inspect("pool")
            .await
            .unwrap()
            .unwrap()
            .holders
            .len(),
        3
    );
    for lease in [taken, leases.into_iter().next().unwrap()] {
        lease.release().await.unwrap();
    }
}

/// A shared hold as the engine keeps it: the key holds `shared:<first holder's value>`, the
/// holders are in `<key>:readers` as `<value> <fence>`, each scored by its expiry (ms on the
/// server's clock); a holder whose expiry has passed (a dead one) is not shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_hold_is_read_as_its_shared_holders_with_their_fences() {
    let env = Env::start().await;
    // Real holder values, from leases of two labelled lockers (released at once).
    let mut values = Vec::new();
    for label in ["reader-a", "reader-b"] {
        let locker = labelled(&env, label).await;
        let lease = locker
            .acquire(&format!("{label}-once"), &LockOptions::new(ms(10_000)))
            .await
            .unwrap();
        values.push(lease.token().to_owned());
        lease.release().await.unwrap();
    }
    // Fences as the clock-based counter gives them (µs since the epoch, exact in a score).
    let fences = [1_750_000_000_000_017_u64, 1_750_000_000_000_018];
    let key = env.key("doc");
    let set = redis::cmd("SET")
        .arg(&key)
        .arg(format!("shared:{}", values[0]))
        .arg("PX")
        .arg(10_000)
        .clone();
    let () = query(&env.raw, &set).await;
    let (secs, micros): (u64, u64) = query(&env.raw, &redis::cmd("TIME")).await;
    let now_ms = secs * 1000 + micros / 1000;
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(format!("{key}:readers"));
    for (fence, value) in fences.iter().zip(&values) {
        zadd.arg(now_ms + 10_000).arg(format!("{value} {fence}"));
    }
    // A holder whose lease ran out a second ago.
    zadd.arg(now_ms - 1_000)
        .arg(format!("{} 1750000000000016", values[1]));
    let _: i64 = query(&env.raw, &zadd).await;

    let info = env.locker.inspect("doc").await.unwrap().unwrap();
    assert_eq!(info.state, LockState::Shared);
    assert_eq!(info.value, format!("shared:{}", values[0]));
    assert_eq!(
        info.holder.as_ref().unwrap().label.as_deref(),
        Some("reader-a")
    );
    let holders: Vec<_> = info
        .holders
        .iter()
        .map(|h| {
            let label = h.holder.as_ref().and_then(|h| h.label.as_deref());
            (h.shared, h.permit, label, h.value.as_str(), h.fence)
        })
        .collect();
    assert_eq!(
        holders,
        [
            (
                true,
                None,
                Some("reader-a"),
                values[0].as_str(),
                Some(fences[0])
            ),
            (
                true,
                None,
                Some("reader-b"),
                values[1].as_str(),
                Some(fences[1])
            ),
        ]
    );
    for h in &info.holders {
        let ttl = h.ttl_left.unwrap();
        assert!(ttl > ms(5_000) && ttl <= ms(10_000), "{ttl:?}");
    }
    // Listed once, under its name: the set of its holders is no lock.
    let listed = env.locker.list("*").await.unwrap();
    let names: Vec<_> = listed.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["doc"]);
    assert_eq!(listed[0].holders.len(), 2);
}

/// A forced release that hands the lock to a waiter computes the waiter's fence and writes the
/// counter: the counter keeps the locker's retention (an expiry), as every key the engine writes
/// does, even where no counter existed before (a lease taken uncontended writes its fence only
/// at its release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_that_hands_the_lock_over_keeps_the_counters_expiry() {
    let env = Env::start().await;
    let o = LockOptions::new(ms(10_000));
    let held = env.locker.acquire("job", &o).await.unwrap();
    let waiter = {
        let locker = env.second_locker().await;
        let o = o.with_wait(ms(10_000));
        tokio::spawn(async move { locker.acquire("job", &o).await })
    };
    eventually(ms(5_000), "the waiter queued", || async {
        let info = env.locker.inspect("job").await.unwrap();
        info.is_some_and(|i| !i.waiters.is_empty())
    })
    .await;
    assert!(!env.exists("lock:{job}:fence").await);
    assert!(env.locker.force_release("job", held.token()).await.unwrap());
    let lease = waiter.await.unwrap().expect("the waiter gets the lock");
    let pttl = env.pttl("lock:{job}:fence").await;
    assert!(pttl > 0, "the fence counter has no expiry: PTTL {pttl}");
    lease.release().await.unwrap();
}
