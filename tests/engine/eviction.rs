//! A server that evicts keys can delete a held lock's key: the unsafe control shows two holders
//! at once under memory pressure, and the check at connect names `maxmemory-policy` (a warning,
//! or a `Config` error with `require_noeviction`). A server that refuses `CONFIG` still works.
//!
//! The tests of this file that log take `SERIAL`: a log capture sees every event only while no
//! other test of the process reaches the same log lines at the same time.

use crate::support;

use lock_runtime::{LockError, LockOptions, Locker};
use lock_testing::RedisServer;
use support::{SERIAL, capture_logs, cycle, exists, ms, raw_connection};

/// A server with little memory that evicts any key (`allkeys-random`, so that a lock key,
/// recently used or not, goes as soon as the cache fills).
fn evicting_server(policy: &str) -> RedisServer {
    RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", policy])
}

/// Cache writes fill the server until `key` is evicted (bounded: at most 64 MB written).
async fn fill_until_evicted(server: &RedisServer, key: &str) -> usize {
    let mut raw = raw_connection(&server.url()).await;
    let blob = "x".repeat(64 * 1024);
    for i in 0..1024 {
        let _: Result<(), _> = redis::cmd("SET")
            .arg(format!("cache:{i}"))
            .arg(&blob)
            .query_async(&mut raw)
            .await;
        if !exists(&raw, key).await {
            return i;
        }
    }
    panic!("`{key}` was never evicted");
}

/// Unsafe control: with an evicting policy, cache writes evict the held key and a second
/// caller takes the lock while the first still holds its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_control_an_evicting_server_lets_two_holders_in() {
    let _alone = SERIAL.lock().await;
    let server = evicting_server("allkeys-random");
    let first = Locker::connect(&server.url()).await.unwrap();
    let second = Locker::connect(&server.url()).await.unwrap();
    let opts = LockOptions::new(ms(30_000));
    let held = first.acquire("job", &opts).await.unwrap();
    let writes = fill_until_evicted(&server, &first.key_of("job")).await;
    let overlap = second.acquire("job", &opts).await.unwrap();
    println!("the held key went after {writes} cache writes");
    // Two leases of one lock, both believed held: the overlap eviction causes.
    assert!(held.is_held() && overlap.is_held());
    assert!(overlap.fence() > held.fence());
}

// One thread: the log capture is per thread.
#[tokio::test]
async fn connect_names_an_evicting_policy() {
    let _alone = SERIAL.lock().await;
    for policy in ["allkeys-lru", "volatile-ttl"] {
        let server = evicting_server(policy);
        let mut connected = None;
        let logs = capture_logs(async {
            connected = Some(Locker::connect(&server.url()).await);
        })
        .await;
        assert!(connected.unwrap().is_ok());
        let warnings: Vec<&String> = logs
            .iter()
            .filter(|l| l.starts_with("WARN") && l.contains("maxmemory-policy"))
            .collect();
        assert_eq!(warnings.len(), 1, "{policy}: {logs:?}");
        assert!(warnings[0].contains(policy), "{}", warnings[0]);
        assert!(warnings[0].contains("noeviction"), "{}", warnings[0]);

        let refused = Locker::builder()
            .url(server.url())
            .require_noeviction()
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(refused, LockError::Config { .. }), "{refused}");
        assert!(
            refused.to_string().contains("maxmemory-policy"),
            "{refused}"
        );
    }
}

/// Connects with `require_noeviction`, and the events logged meanwhile.
async fn connect_requiring_noeviction(
    server: &RedisServer,
) -> (Result<Locker, LockError>, Vec<String>) {
    let mut connected = None;
    let logs = capture_logs(async {
        let builder = Locker::builder().url(server.url()).require_noeviction();
        connected = Some(builder.connect().await);
    })
    .await;
    (connected.expect("the capture ran the connect"), logs)
}

// One thread: the log capture is per thread.
#[tokio::test]
async fn a_server_that_does_not_evict_passes_in_silence() {
    let _alone = SERIAL.lock().await;
    let server = RedisServer::start();
    let (connected, logs) = connect_requiring_noeviction(&server).await;
    assert!(connected.is_ok());
    assert!(
        !logs.iter().any(|l| l.contains("maxmemory-policy")),
        "{logs:?}"
    );
}

/// `CONFIG` renamed away (as managed services do): the policy cannot be read, the locker
/// connects and works, and says so at DEBUG.
// One thread: the log capture is per thread.
#[tokio::test]
async fn a_server_that_refuses_config_still_works() {
    let _alone = SERIAL.lock().await;
    let server = RedisServer::start_with(&["--rename-command", "CONFIG", "\"\""]);
    let (connected, logs) = connect_requiring_noeviction(&server).await;
    let locker = connected.unwrap();
    assert!(
        logs.iter()
            .any(|l| l.starts_with("DEBUG") && l.contains("cannot read maxmemory-policy")),
        "{logs:?}"
    );
    cycle(&locker, "job", &LockOptions::new(ms(5_000))).await;
}
