//! Key formats: no lock name reaches another lock's keys, a foreign client's keys are never
//! written, keys of another shape are skipped by `list`, and a fence counter at its limit is an
//! error, not a smaller fence.

use crate::support;

use lock_runtime::{KeyFormat, LockError, LockOptions, LockState, Locker};
use lock_testing::RedisServer;
use redis::aio::MultiplexedConnection;
use support::{connect_with, eventually, ms, query, raw_connection};

async fn plain_locker(server: &RedisServer) -> Locker {
    connect_with(&server.url(), |b| b.key_format(KeyFormat::Plain)).await
}

async fn raw_set(raw: &MultiplexedConnection, key: &str, value: &str) {
    let () = query(raw, redis::cmd("SET").arg(key).arg(value)).await;
}

async fn raw_get(raw: &MultiplexedConnection, key: &str) -> Option<String> {
    query(raw, redis::cmd("GET").arg(key)).await
}

/// `job:fence` is a lock of its own: releasing `job` (which records its fence, with and without
/// a waiter to grant it to) leaves its holder holding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_named_like_another_locks_counter_keeps_its_holder() {
    let server = RedisServer::start();
    let locker = plain_locker(&server).await;
    let other = plain_locker(&server).await;
    let raw = raw_connection(&server.url()).await;
    let opts = LockOptions::new(ms(10_000));
    let mut held = Vec::new();
    for name in [
        "job:fence",
        "job:waiters",
        "job:waiters:state",
        "job:released",
    ] {
        held.push(locker.acquire(name, &opts).await.unwrap());
    }
    let tokens: Vec<String> = held.iter().map(|l| l.token().to_owned()).collect();

    // An uncontended lease of `job` (its fence is recorded at release)...
    let lease = other.acquire("job", &opts).await.unwrap();
    let fence = lease.fence();
    // ...and one a waiter queues behind, so that its release grants `job` on.
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new(ms(10_000)).with_wait(ms(10_000));
            let lease = other.acquire("job", &opts).await.unwrap();
            let fence = lease.fence();
            lease.release().await.unwrap();
            fence
        })
    };
    eventually(ms(5_000), "the waiter queued", || async {
        let info = locker.inspect("job").await.unwrap();
        info.is_some_and(|i| !i.waiters.is_empty())
    })
    .await;
    lease.release().await.unwrap();
    assert!(waiter.await.unwrap() > fence);

    for (lease, token) in held.into_iter().zip(tokens) {
        let key = locker.key_of(lease.name());
        let value = raw_get(&raw, &key).await;
        assert!(
            value
                .as_deref()
                .is_some_and(|v| token.starts_with(&v[..v.len() - 1])),
            "`{key}` was overwritten: {value:?}"
        );
        assert!(lease.is_held(), "{key}");
        lease.release().await.unwrap();
    }
}

/// A foreign client holding plain keys where an older layout kept a lock's counter and queue
/// (`lock:job:fence`, `lock:job:waiters` as a string, as redis-py's `Lock` writes them): waiters
/// on `job` queue and are served, and those keys keep their values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_clients_keys_are_never_written() {
    let server = RedisServer::start();
    let locker = plain_locker(&server).await;
    let raw = raw_connection(&server.url()).await;
    let foreign = [
        ("lock:job:fence", "python-token-1"),
        ("lock:job:waiters", "python-token-2"),
        ("lock:job:waiters:state", "python-token-3"),
    ];
    for (key, value) in foreign {
        raw_set(&raw, key, value).await;
    }
    let holder = locker.acquire("job", &LockOptions::new(ms(10_000))).await;
    let holder = holder.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let opts = LockOptions::new(ms(10_000)).with_wait(ms(10_000));
                locker.acquire("job", &opts).await?.release().await
            })
        })
        .collect();
    eventually(ms(5_000), "three waiters queued", || async {
        let info = locker.inspect("job").await.unwrap();
        info.is_some_and(|i| i.waiters.len() == 3)
    })
    .await;
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    for (key, value) in foreign {
        assert_eq!(raw_get(&raw, key).await.as_deref(), Some(value), "{key}");
    }
    // `list` shows the foreign keys as locks of another client, and does not fail.
    let listed = locker.list("*").await.unwrap();
    let names: Vec<&str> = listed.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["job:fence", "job:waiters", "job:waiters:state"]);
    assert!(listed.iter().all(|i| i.state == LockState::Foreign));
}

/// Keys of another type where a lock, its counter or its queue would be: `list` shows what it
/// can and skips what it does not understand, instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_skips_keys_it_does_not_understand() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let raw = raw_connection(&server.url()).await;
    let lease = locker
        .acquire("job", &LockOptions::new(ms(10_000)))
        .await
        .unwrap();
    // A hash where a lock key would be, a hash as `job`'s counter, a string as its queue.
    for hash in ["lock:{hash}", "lock:{job}:fence"] {
        let () = query(&raw, redis::cmd("HSET").arg(hash).arg("f").arg("v")).await;
    }
    raw_set(&raw, "lock:{job}:waiters", "not a queue").await;
    let listed = locker.list("*").await.unwrap();
    let states: Vec<(&str, &LockState)> =
        listed.iter().map(|i| (i.name.as_str(), &i.state)).collect();
    assert_eq!(
        states,
        [("hash", &LockState::Foreign), ("job", &LockState::Held)]
    );
    let job = &listed[1];
    assert_eq!((job.fence, job.waiters.len()), (None, 0));
    lease.release().await.unwrap();
}

/// A counter at the largest fence, or above it, gives no fence (an error that says so, the
/// key left free); one below it gives exactly the largest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_counter_at_its_limit_is_an_error_not_a_smaller_fence() {
    const MAX: u64 = (1 << 53) - 1;
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let raw = raw_connection(&server.url()).await;
    let key = locker.key_of("job");
    // Uncontended (plain commands), waiting (the script), and without a fence read first.
    let ways = [
        LockOptions::new(ms(5_000)),
        LockOptions::new(ms(5_000)).with_wait(ms(1_000)),
    ];
    for opts in &ways {
        raw_set(&raw, &format!("{key}:fence"), &(MAX - 1).to_string()).await;
        let lease = locker.acquire("job", opts).await.unwrap();
        assert_eq!(lease.fence(), MAX);
        lease.release().await.unwrap();
        for counter in [MAX.to_string(), u64::MAX.to_string(), "1e300".to_owned()] {
            raw_set(&raw, &format!("{key}:fence"), &counter).await;
            let err = locker.acquire("job", opts).await.unwrap_err();
            assert!(
                matches!(err, LockError::NotALock { .. }),
                "{counter}: {err}"
            );
            let text = err.to_string();
            assert!(text.contains("largest fence"), "{counter}: {text}");
            assert_eq!(raw_get(&raw, &key).await, None, "{counter}");
            assert_eq!(
                raw_get(&raw, &format!("{key}:fence")).await,
                Some(counter.clone())
            );
        }
    }
}

/// The fence a release records (a lease taken by the uncontended path) only ever raises the
/// counter: a higher number, or a value of another client, written while the lease was held,
/// stays as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_only_ever_raises_the_fence_counter() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let raw = raw_connection(&server.url()).await;
    let counter = format!("{}:fence", locker.key_of("job"));
    let opts = LockOptions::new(ms(5_000));
    let lease = locker.acquire("job", &opts).await.unwrap();
    let fence = lease.fence();
    lease.release().await.unwrap();
    assert_eq!(raw_get(&raw, &counter).await, Some(fence.to_string()));
    for meanwhile in [
        (fence + 1_000_000_000).to_string(),
        "not a counter".to_owned(),
        "-5".to_owned(),
        "2.5".to_owned(),
    ] {
        // Taken on the uncontended path: its fence is recorded at release.
        raw_set(&raw, &counter, "1").await;
        let lease = locker.acquire("job", &opts).await.unwrap();
        raw_set(&raw, &counter, &meanwhile).await;
        lease.release().await.unwrap();
        assert_eq!(raw_get(&raw, &counter).await, Some(meanwhile));
    }
}

/// Both key formats on one server, with the default prefix: a Plain lock named after a derived
/// key of a hash-tagged lock (`{bars}:readers` is `lock:{bars}:readers`, the shared holders of
/// `bars`) keeps its key and its holder through every mode of `bars` (a shared hold, a waiter
/// queueing, permits): the hash-tagged caller is told which key is not its own, and nothing of
/// the Plain holder's is deleted or overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_script_deletes_or_overwrites_a_key_of_the_other_format() {
    let server = RedisServer::start();
    let plain = plain_locker(&server).await;
    let tagged = Locker::connect(&server.url()).await.unwrap();
    let raw = raw_connection(&server.url()).await;
    let opts = LockOptions::new(ms(10_000));
    let derived = [
        "{bars}:readers",
        "{bars}:waiters",
        "{bars}:waiters:state",
        "{bars}:fence",
    ];
    let mut held = Vec::new();
    for name in derived {
        held.push(plain.acquire(name, &opts).await.unwrap());
    }
    let values: Vec<String> = held.iter().map(|l| l.token().to_owned()).collect();
    let waiting = opts.with_wait(ms(300));
    let attempts = [
        ("a shared hold", opts.with_shared(true)),
        ("a waiting shared hold", waiting.with_shared(true)),
        ("a permit", opts.with_permits(3)),
        ("a waiting permit", waiting.with_permits(3)),
        ("an exclusive hold", opts),
    ];
    for (what, o) in &attempts {
        match tagged.acquire("bars", o).await {
            Ok(lease) => lease.release().await.unwrap(),
            Err(LockError::NotALock { key, .. }) => {
                assert!(
                    derived.iter().any(|d| key == format!("lock:{d}")),
                    "{what}: {key}"
                );
            }
            Err(e) => panic!("{what}: {e}"),
        }
        // Nothing is left held by an attempt that was refused.
        assert_eq!(tagged.inspect("bars").await.unwrap(), None, "{what}");
    }
    // A waiter queues behind an exclusive holder of `cellar`, whose queue is a Plain lock's key.
    let queue = plain.acquire("{cellar}:waiters", &opts).await.unwrap();
    let holder = tagged.acquire("cellar", &opts).await.unwrap();
    let err = tagged.acquire("cellar", &waiting).await.unwrap_err();
    assert!(matches!(err, LockError::NotALock { .. }), "{err}");
    assert!(err.to_string().contains("lock:{cellar}:waiters"), "{err}");
    holder.release().await.unwrap();
    assert!(queue.is_held());
    queue.release().await.unwrap();
    for ((name, lease), value) in derived.iter().zip(&held).zip(&values) {
        let key = format!("lock:{name}");
        assert_eq!(
            raw_get(&raw, &key).await.as_deref(),
            Some(value.as_str()),
            "{key}"
        );
        assert!(lease.is_held(), "{name} lost its key");
    }
    for lease in held {
        lease.release().await.unwrap();
    }
}
