//! Python and Rust workers on the same lock names (issue 13): the Python article's
//! `acquire_lock`/`release_lock` (`SET lock:<name> <uuid> NX EX`, Lua compare-and-delete) in
//! child processes, and Rust workers through `#[distributed_lock]` on a `KeyFormat::Plain`
//! locker, all incrementing one counter with a read-sleep-write. With plain keys no update is
//! lost; the unsafe control (the Rust side on the default hash-tagged keys, which are other
//! keys than Python's) loses updates. Needs `python3` with redis-py (`cargo xtask test` installs
//! it with pip when it is missing).

use std::process::{Command, Stdio};
use std::time::Duration;

use lock_runtime::testing::RedisServer;
use lock_runtime::{KeyFormat, LockError, Locker, distributed_lock};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/article_lock.py");
const PYTHON_WORKERS: usize = 2;
const RUST_WORKERS: usize = 2;
const INCREMENTS: usize = 40;
/// The read-sleep-write window.
const SLEEP_MS: u64 = 3;
const COUNTER: &str = "interop:counter";

#[distributed_lock(name = "counter", ttl = "10s", wait = "30s", locker = locker)]
async fn increment(
    locker: &Locker,
    conn: &redis::aio::MultiplexedConnection,
) -> Result<(), LockError> {
    let mut conn = conn.clone();
    let value: Option<u64> = redis::cmd("GET")
        .arg(COUNTER)
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(SLEEP_MS)).await;
    let _: () = redis::cmd("SET")
        .arg(COUNTER)
        .arg(value.unwrap_or(0) + 1)
        .query_async(&mut conn)
        .await
        .unwrap();
    Ok(())
}

fn python_ready() {
    let check = Command::new("python3")
        .args(["-c", "import redis"])
        .output();
    match check {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "redis-py is missing: run `python3 -m pip install redis` (cargo xtask test does): {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!("python3 is needed for this test (install python3 and pip): {e}"),
    }
}

/// Runs the Python and Rust workers side by side; returns the counter's final value.
async fn run_side_by_side(format: KeyFormat) -> u64 {
    let server = RedisServer::start();
    let url = server.url();
    let locker = Locker::builder()
        .url(&url)
        .key_format(format)
        .connect()
        .await
        .unwrap();
    let conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let pythons: Vec<_> = (0..PYTHON_WORKERS)
        .map(|_| {
            Command::new("python3")
                .args([
                    SCRIPT,
                    &url,
                    "counter",
                    COUNTER,
                    &INCREMENTS.to_string(),
                    &SLEEP_MS.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("python3 runs")
        })
        .collect();
    let rusts: Vec<_> = (0..RUST_WORKERS)
        .map(|_| {
            let (locker, conn) = (locker.clone(), conn.clone());
            tokio::spawn(async move {
                for _ in 0..INCREMENTS {
                    increment(&locker, &conn).await.unwrap();
                }
            })
        })
        .collect();
    for r in rusts {
        r.await.unwrap();
    }
    for p in pythons {
        let out = tokio::task::spawn_blocking(move || p.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(out.status.success(), "python worker: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("DONE {INCREMENTS}")
        );
    }
    let mut conn = conn.clone();
    let value: Option<u64> = redis::cmd("GET")
        .arg(COUNTER)
        .query_async(&mut conn)
        .await
        .unwrap();
    value.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_rust_workers_share_plain_lock_names_without_lost_updates() {
    python_ready();
    let total = ((PYTHON_WORKERS + RUST_WORKERS) * INCREMENTS) as u64;
    assert_eq!(
        run_side_by_side(KeyFormat::Plain).await,
        total,
        "0 lost updates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_control_hash_tagged_keys_do_not_exclude_python_and_lose_updates() {
    python_ready();
    let total = ((PYTHON_WORKERS + RUST_WORKERS) * INCREMENTS) as u64;
    let value = run_side_by_side(KeyFormat::HashTagged).await;
    assert!(value < total, "updates were lost: {value} of {total}");
    println!("unsafe control: {value} of {total} increments survived");
}

/// A plain key held by a client that releases without publishing (a bare `DEL`): a waiter finds
/// out by its short poll, well before the key's 10 s ttl. On Redlock, where no waiter queue
/// makes waiters come back on their own, only the poll can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_plain_key_notices_an_unannounced_release() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let locker = Locker::builder()
        .urls(servers.iter().map(RedisServer::url))
        .key_format(KeyFormat::Plain)
        .connect()
        .await
        .unwrap();
    assert_eq!(locker.key_of("report"), "lock:report");
    let mut raws = Vec::new();
    for server in &servers {
        let mut raw = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg("lock:report")
            .arg("python-holder")
            .arg("NX")
            .arg("EX")
            .arg(10)
            .query_async(&mut raw)
            .await
            .unwrap();
        raws.push(raw);
    }
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let opts = lock_runtime::LockOptions::new(Duration::from_secs(5))
                .with_wait(Duration::from_secs(8));
            let lease = locker.acquire("report", &opts).await.unwrap();
            let got = tokio::time::Instant::now();
            lease.release().await.unwrap();
            got
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deleted = tokio::time::Instant::now();
    for raw in &mut raws {
        let _: i64 = redis::cmd("DEL")
            .arg("lock:report")
            .query_async(raw)
            .await
            .unwrap();
    }
    let got = waiter.await.unwrap();
    let after = got.duration_since(deleted);
    // The poll is 20 ms plus jitter; the key had almost 10 s left.
    assert!(
        after < Duration::from_secs(2),
        "took {after:?} after the release"
    );
}
