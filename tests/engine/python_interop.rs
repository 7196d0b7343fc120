//! Python and Rust workers on the same lock names: the Python article's `acquire_lock`/
//! `release_lock` (`SET lock:<name> <uuid> NX EX`, Lua compare-and-delete) in child processes,
//! and Rust workers through `#[distributed_lock]` on a `KeyFormat::Plain` locker, all
//! incrementing one counter with a read-sleep-write. With plain keys no update is lost; the
//! unsafe control (the Rust side on the default hash-tagged keys, which are other keys than
//! Python's) loses updates. Needs redis-py: in the virtual environment that `cargo xtask test`
//! (or `cargo xtask setup`) makes in `target/tmp/python-venv`, else in `python3` itself.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use lock_runtime::{KeyFormat, LockError, Locker, distributed_lock};
use lock_testing::RedisServer;
use support::{connect_with, query, raw_connection};
use tokio::time::timeout;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/article_lock.py");
const PYTHON_WORKERS: usize = 2;
const RUST_WORKERS: usize = 2;
const INCREMENTS: usize = 40;
/// The sections of a run, on both sides: the increments a run makes when none is lost.
const SECTIONS: u64 = ((PYTHON_WORKERS + RUST_WORKERS) * INCREMENTS) as u64;
/// The read-sleep-write window: wide enough that two sections running at once (the unsafe
/// control) almost always lose an update, short enough to keep the test at a few seconds.
const SLEEP_MS: u64 = 5;
const COUNTER: &str = "interop:counter";
/// Each section appends its side ("py" or "rs") here, in the order the sections ran.
const LOG: &str = "interop:counter:log";
/// A bound on each phase (Python's start-up, the run, the Python workers' end), far above what
/// they take (about 0.2 s, 2 s and nothing), so that a stuck worker fails the test instead of
/// hanging it.
const PHASE_LIMIT: Duration = Duration::from_secs(60);

#[distributed_lock(name = "counter", ttl = "10s", wait = "30s", locker = locker)]
async fn increment(
    locker: &Locker,
    conn: &redis::aio::MultiplexedConnection,
) -> Result<(), LockError> {
    let value: Option<u64> = query(conn, redis::cmd("GET").arg(COUNTER)).await;
    tokio::time::sleep(Duration::from_millis(SLEEP_MS)).await;
    let () = query(
        conn,
        redis::cmd("SET").arg(COUNTER).arg(value.unwrap_or(0) + 1),
    )
    .await;
    let _: i64 = query(conn, redis::cmd("RPUSH").arg(LOG).arg("rs")).await;
    Ok(())
}

/// The virtual environment that `cargo xtask setup` makes for this test, under cargo's directory
/// for the integration tests' files.
const VENV: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/python-venv");

/// The Python that runs the workers: the virtual environment's when there is one, else `python3`.
fn python() -> String {
    let venv = format!("{VENV}/bin/python3");
    if std::path::Path::new(&venv).exists() {
        venv
    } else {
        "python3".to_owned()
    }
}

/// Fails the test, saying what to do, when Python or redis-py is missing (never a silent skip).
fn python_ready() {
    let python = python();
    let check = Command::new(&python).args(["-c", "import redis"]).output();
    match check {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "{python} cannot import redis-py: run `cargo xtask setup`, which installs it in the \
             virtual environment {VENV}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "{python} is needed for this test: install python3, then run `cargo xtask setup`: {e}"
        ),
    }
}

/// One Python worker process; killed on drop, so that a failing test leaves none behind.
struct PythonWorker {
    child: Child,
    stdout: Option<BufReader<ChildStdout>>,
}

impl PythonWorker {
    fn spawn(url: &str) -> Self {
        let mut child = Command::new(python())
            .args([
                SCRIPT,
                url,
                "counter",
                COUNTER,
                &INCREMENTS.to_string(),
                &SLEEP_MS.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python runs");
        let stdout = child.stdout.take().map(BufReader::new);
        Self { child, stdout }
    }

    /// The worker's next line of output, within [`PHASE_LIMIT`].
    async fn line(&mut self, what: &str) -> String {
        let mut stdout = self.stdout.take().expect("stdout");
        let read = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            stdout.read_line(&mut line).map(|_| (line, stdout))
        });
        let (line, stdout) = timeout(PHASE_LIMIT, read)
            .await
            .unwrap_or_else(|_| panic!("no {what} from a Python worker within {PHASE_LIMIT:?}"))
            .unwrap()
            .unwrap();
        self.stdout = Some(stdout);
        line.trim().to_owned()
    }

    fn start(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"GO\n")
            .and_then(|()| stdin.flush())
            .unwrap();
    }
}

impl Drop for PythonWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a run left behind: the counter, and which side ran each section, in order.
struct Outcome {
    counter: u64,
    log: Vec<String>,
}

impl Outcome {
    /// How often the log changes side: each change is a hand-over between Python and Rust.
    fn switches(&self) -> usize {
        self.log.windows(2).filter(|w| w[0] != w[1]).count()
    }
}

/// Runs the Python and Rust workers side by side, all started at once once every Python worker
/// is connected (failing first, saying what to do, when python3 or redis-py is missing).
async fn run_side_by_side(format: KeyFormat) -> Outcome {
    python_ready();
    let server = RedisServer::start();
    let url = server.url();
    let locker = connect_with(&url, |b| b.key_format(format)).await;
    let conn = raw_connection(&url).await;
    let mut pythons: Vec<PythonWorker> = (0..PYTHON_WORKERS)
        .map(|_| PythonWorker::spawn(&url))
        .collect();
    for p in &mut pythons {
        assert_eq!(p.line("READY").await, "READY");
    }
    // Both sides start now: Python's start-up (importing redis-py) does not leave the Rust side
    // running alone.
    for p in &mut pythons {
        p.start();
    }
    let rusts: Vec<_> = (0..RUST_WORKERS)
        .map(|w| {
            let (locker, conn) = (locker.clone(), conn.clone());
            tokio::spawn(async move {
                for i in 0..INCREMENTS as u64 {
                    increment(&locker, &conn).await.unwrap();
                    // Other work between sections (0 to 3 x SLEEP_MS, varied), as the Python
                    // workers do: without it each side would pass the lock among its own
                    // workers until they are all done, and the sides would never interleave.
                    let pause = (i * 7 + w as u64 * 3) % (3 * SLEEP_MS + 1);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            })
        })
        .collect();
    for r in rusts {
        timeout(PHASE_LIMIT, r)
            .await
            .expect("the Rust workers finish")
            .unwrap();
    }
    for p in &mut pythons {
        assert_eq!(p.line("DONE").await, format!("DONE {INCREMENTS}"));
    }
    for mut p in pythons {
        let status = p.child.wait().unwrap();
        assert!(status.success(), "python worker: {status}");
    }
    let counter: Option<u64> = query(&conn, redis::cmd("GET").arg(COUNTER)).await;
    let log: Vec<String> = query(&conn, redis::cmd("LRANGE").arg(LOG).arg(0).arg(-1)).await;
    assert_eq!(
        log.len() as u64,
        SECTIONS,
        "every section ran and logged itself"
    );
    Outcome {
        counter: counter.unwrap_or(0),
        log,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_rust_workers_share_plain_lock_names_without_lost_updates() {
    let outcome = run_side_by_side(KeyFormat::Plain).await;
    println!(
        "plain keys: {} of {SECTIONS} increments, {} hand-overs between the sides",
        outcome.counter,
        outcome.switches()
    );
    assert_eq!(outcome.counter, SECTIONS, "0 lost updates");
    // The lock went from Python to Rust and from Rust to Python while both sides still had
    // sections to run: each side waited on the other's key, so the 0 above is exclusion both
    // ways, not luck of timing.
    let handed = |from: &str, to: &str| outcome.log.windows(2).any(|w| w[0] == from && w[1] == to);
    assert!(
        handed("py", "rs") && handed("rs", "py"),
        "the sides did not interleave: {:?}",
        outcome.log
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_control_hash_tagged_keys_do_not_exclude_python_and_lose_updates() {
    let outcome = run_side_by_side(KeyFormat::HashTagged).await;
    let kept = outcome.counter;
    println!("unsafe control: {kept} of {SECTIONS} increments survived");
    assert!(kept < SECTIONS, "no update was lost: {kept} of {SECTIONS}");
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
    let held = redis::cmd("SET")
        .arg("lock:report")
        .arg("python-holder")
        .arg("NX")
        .arg("EX")
        .arg(10)
        .clone();
    let mut raws = Vec::new();
    for server in &servers {
        let raw = raw_connection(&server.url()).await;
        let () = query(&raw, &held).await;
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
    for raw in &raws {
        let _: i64 = query(raw, redis::cmd("DEL").arg("lock:report")).await;
    }
    let got = waiter.await.unwrap();
    let after = got.duration_since(deleted);
    // The poll is 20 ms plus jitter; the key had almost 10 s left.
    assert!(
        after < Duration::from_secs(2),
        "took {after:?} after the release"
    );
}

/// Python clients holding the plain keys `lock:job:fence` (redis-py's `Lock`) and
/// `lock:job:waiters` (the article's `acquire_lock`) while Rust callers queue for `job`, are
/// served and release it (recording fences): both Python locks are still theirs at the end
/// (redis-py's `release` raises if its value changed, the article's returns 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_locks_named_like_a_rust_locks_counter_and_queue_are_never_written() {
    python_ready();
    let server = RedisServer::start();
    let dir = std::path::Path::new(SCRIPT).parent().unwrap();
    let program = format!(
        r#"
import sys
sys.path.insert(0, {dir:?})
import redis
from article_lock import acquire_lock, release_lock
conn = redis.Redis.from_url(sys.argv[1])
lock = conn.lock('lock:job:fence', timeout=60)
assert lock.acquire(blocking=False)
ident = acquire_lock(conn, 'job:waiters', acquire_timeout=1, lock_timeout=60)
assert ident
print('HELD', flush=True)
sys.stdin.readline()
lock.release()
assert release_lock(conn, 'job:waiters', ident) == 1
print('RELEASED', flush=True)
"#,
        dir = dir.display().to_string()
    );
    let child = Command::new(python())
        .args(["-c", &program, &server.url()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python runs");
    let mut python = PythonWorker {
        stdout: None,
        child,
    };
    python.stdout = python.child.stdout.take().map(BufReader::new);
    assert_eq!(python.line("HELD").await, "HELD");

    let locker = connect_with(&server.url(), |b| b.key_format(KeyFormat::Plain)).await;
    let opts = lock_runtime::LockOptions::new(Duration::from_secs(10));
    let holder = locker.acquire("job", &opts).await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let opts = lock_runtime::LockOptions::new(Duration::from_secs(10))
                    .with_wait(Duration::from_secs(10));
                locker.acquire("job", &opts).await?.release().await
            })
        })
        .collect();
    let queued = async {
        loop {
            let info = locker.inspect("job").await.unwrap();
            if info.is_some_and(|i| i.waiters.len() == 3) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    timeout(PHASE_LIMIT, queued)
        .await
        .expect("three waiters queue");
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    // Python's locks show in `list` as another client's, and do not break it.
    let names: Vec<String> = locker
        .list("*")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["job:fence", "job:waiters"]);
    python.start();
    assert_eq!(python.line("RELEASED").await, "RELEASED");
}
