//! Row 9c: contended throughput and fairness the way python-redis-lock measures them: N clients
//! (each with its own connections) take one name in a loop with no hold, for a fixed time; the
//! acquisitions in all, and the least and most served client. The engine beside rslock (its
//! `acquire` loop) and redis-py's `Lock` (Python processes), in the same run.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{LockOptions, Locker};
use lock_testing::RedisServer;
use rslock::LockManager;
use tokio::time::Instant;

use crate::report::{Report, Verdict};

const CLIENTS: [usize; 3] = [1, 8, 48];
const NAME: &str = "bench:fair";

/// Acquisitions per client.
type Counts = Vec<u64>;

fn summary(counts: &Counts) -> String {
    let total: u64 = counts.iter().sum();
    let least = counts.iter().min().copied().unwrap_or(0);
    let most = counts.iter().max().copied().unwrap_or(0);
    format!("{total} (least {least}, most {most})")
}

/// Each client task's acquisitions, in client order.
async fn join_counts(tasks: Vec<tokio::task::JoinHandle<u64>>) -> Counts {
    let mut counts = Vec::with_capacity(tasks.len());
    for task in tasks {
        counts.push(task.await.expect("client"));
    }
    counts
}

async fn engine(url: &str, clients: usize, window: Duration) -> Counts {
    let opts = LockOptions::new(Duration::from_secs(5)).with_wait(Duration::from_secs(60));
    let mut lockers = Vec::new();
    for _ in 0..clients {
        lockers.push(Locker::connect(url).await.expect("connects"));
    }
    let end = Instant::now() + window;
    let tasks: Vec<_> = lockers
        .into_iter()
        .map(|locker| {
            tokio::spawn(async move {
                let mut n = 0;
                while Instant::now() < end {
                    let lease = locker.acquire(NAME, &opts).await.expect("acquire");
                    lease.release().await.expect("release");
                    n += 1;
                }
                n
            })
        })
        .collect();
    join_counts(tasks).await
}

async fn rslock(url: &str, clients: usize, window: Duration) -> Counts {
    let end = Instant::now() + window;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let manager = LockManager::new(vec![url.to_owned()]);
            tokio::spawn(async move {
                let mut n = 0;
                while Instant::now() < end {
                    let lock = manager
                        .acquire_no_guard(NAME, Duration::from_secs(5))
                        .await
                        .expect("rslock");
                    manager.unlock(&lock).await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    join_counts(tasks).await
}

/// The Python with redis-py that `cargo xtask setup` makes, if any.
fn python() -> Option<String> {
    let venv = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/tmp/python-venv/bin/python3"
    );
    [venv, "python3"].into_iter().map(str::to_owned).find(|p| {
        std::process::Command::new(p)
            .args(["-c", "import redis"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// redis-py's `Lock` (its defaults: polling every 0.1 s while blocked), one process per client.
async fn redis_py(python: &str, url: &str, clients: usize, window: Duration) -> Counts {
    const WORKER: &str = "import redis, sys, time\n\
        url, name, start, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])\n\
        r = redis.Redis.from_url(url)\n\
        r.ping()\n\
        time.sleep(max(0.0, start - time.time()))\n\
        n = 0\n\
        while time.time() < end:\n\
        \x20   lock = r.lock(name, timeout=5, blocking_timeout=60)\n\
        \x20   if lock.acquire():\n\
        \x20       n += 1\n\
        \x20       lock.release()\n\
        print(n)\n";
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    // Every process starts together, once all are up.
    let start = now + Duration::from_secs(2);
    let end = start + window;
    let children: Vec<_> = (0..clients)
        .map(|_| {
            tokio::process::Command::new(python)
                .args([
                    "-c",
                    WORKER,
                    url,
                    "bench:fair:py",
                    &start.as_secs_f64().to_string(),
                    &end.as_secs_f64().to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("python starts")
        })
        .collect();
    let mut counts = Vec::new();
    for child in children {
        let out = child.wait_with_output().await.expect("python ends");
        counts.push(
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .unwrap_or(0),
        );
    }
    counts
}

pub(crate) async fn fairness(window: Duration, report: &mut Report) {
    eprintln!("row 9c: contended throughput and fairness, 1 to 48 clients, hold 0");
    let server = RedisServer::start();
    let url = server.url();
    let python = python();
    for clients in CLIENTS {
        let ours = engine(&url, clients, window).await;
        let theirs = rslock(&url, clients, window).await;
        let py = match &python {
            Some(python) => summary(&redis_py(python, &url, clients, window).await),
            None => "redis-py not found (cargo xtask setup)".to_owned(),
        };
        let total = |c: &Counts| c.iter().sum::<u64>().max(1) as f64;
        report.row(
            &format!("9c.{clients}"),
            &format!(
                "{clients} clients on one name, hold 0, {window:?}: acquisitions (least / most served client)"
            ),
            summary(&ours),
            format!("rslock {}; redis-py Lock {py}", summary(&theirs)),
            format!("{:.2} (vs rslock)", total(&ours) / total(&theirs)),
            "report",
            Verdict::Info,
        );
    }
}
