//! A long job whose holder crashes: `lease` frees the lock within seconds, while a live holder
//! may run for as long as `ttl` allows.
//!
//! Run: `cargo xtask example crash_recovery` or
//! `cargo run -p lock-examples --example crash_recovery` (uses `REDIS_URL` when set, else a
//! private redis-server).
//!
//! The nightly job may run for two hours (`ttl = "2h"`), and its key expires 2 s after its last
//! renewal (`lease = "2s"`, renewed every `lease / 3`). The example starts the job in a worker
//! process, kills that process with SIGKILL mid-job (no release is ever sent), and then runs the
//! job itself: it waits about the lease, not two hours.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use lock_runtime::{LockError, Locker, distributed_lock};
use lock_testing::redis_url_or_private_server;
use tokio::time::Instant;

/// The nightly job: hours of work, cluster-wide once; returns when it started. A caller that
/// finds it held waits up to 10 s for it.
#[distributed_lock(name = "nightly", ttl = "2h", lease = "2s", wait = "10s")]
async fn nightly(worker: &str) -> Result<Instant, LockError> {
    let started = Instant::now();
    println!("started by {worker}");
    // Stands for the job's work.
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!("finished by {worker}");
    Ok(started)
}

async fn use_locker(url: &str, label: &str) {
    let locker = Locker::builder()
        .url(url)
        .label(label)
        .connect()
        .await
        .expect("connect");
    lock_runtime::set_default_locker(locker).expect("first default locker");
}

#[tokio::main]
async fn main() {
    lock_examples::show_lock_events();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, url] = &args[..]
        && flag == "--worker"
    {
        use_locker(url, "worker").await;
        nightly("the worker").await.expect("the worker's run");
        return;
    }
    let (url, _server) = redis_url_or_private_server();
    let mut worker = Command::new(std::env::current_exe().expect("this program"))
        .args(["--worker", &url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the worker");
    let mut lines = BufReader::new(worker.stdout.take().expect("piped")).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    println!("worker: {first}");
    worker.kill().expect("SIGKILL the worker");
    worker.wait().expect("the worker is gone");
    let killed = Instant::now();
    println!("worker killed mid-job; its key expires within the 2 s lease, not the 2 h ttl");
    use_locker(&url, "main").await;
    let started = nightly("the main process").await.expect("the main run");
    let waited = (started - killed).as_secs_f64();
    println!("the job started again {waited:.1} s after the crash");
    if waited > 3.0 {
        println!("that is longer than the lease");
        std::process::exit(1);
    }
}
