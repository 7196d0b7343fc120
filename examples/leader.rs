//! Leader election: three processes campaign for `scheduler`; the leader runs a
//! tokio-cron-scheduler job every second. The example kills the leader; another process takes
//! over within the 2 s lease and the schedule goes on, while this process watches who leads.
//!
//! Run: `cargo xtask example leader` or
//! `cargo run -p lock-examples --features cron --example leader` (uses `REDIS_URL` when set,
//! else a private redis-server). `lockctl watch scheduler` shows the same changes.

use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockOptions, Locker};
use lock_testing::redis_url_or_private_server;
use tokio::time::Instant;
use tokio_cron_scheduler::{Job, JobScheduler};

/// The lead's lease: a leader that dies is replaced within it.
const LEASE: Duration = Duration::from_secs(2);

/// A worker: campaigns, runs the schedule while it leads, and campaigns again when it stops.
async fn worker(url: &str, label: &str) {
    let locker = Locker::builder()
        .url(url)
        .label(label)
        .connect()
        .await
        .expect("connect");
    let opts = LockOptions::new(LEASE);
    loop {
        let lease = Arc::new(locker.campaign("scheduler", &opts).await.expect("campaign"));
        println!("{label}: leading, term {}", lease.fence());
        let mut schedule = JobScheduler::new().await.expect("scheduler");
        let (held, label_tick) = (Arc::clone(&lease), label.to_owned());
        // Every second (the fields are second, minute, hour, day, month, weekday).
        let tick = Job::new_async("*/1 * * * * *", move |_, _| {
            let (held, label) = (Arc::clone(&held), label_tick.clone());
            Box::pin(async move {
                // The schedule runs only under the lead (a paused leader's tick is skipped).
                if held.is_held() {
                    println!("{label}: tick (term {})", held.fence());
                }
            })
        })
        .expect("job");
        schedule.add(tick).await.expect("add the job");
        schedule.start().await.expect("start the schedule");
        let reason = lease.lost().await;
        schedule.shutdown().await.expect("stop the schedule");
        println!("{label}: no longer leading ({reason})");
    }
}

/// The running workers, by process id.
fn spawn_workers(url: &str) -> Vec<(String, Child)> {
    ["alpha", "beta", "gamma"]
        .into_iter()
        .map(|label| {
            let child = Command::new(std::env::current_exe().expect("this program"))
                .args(["--worker", url, label])
                .spawn()
                .expect("start a worker");
            (label.to_owned(), child)
        })
        .collect()
}

#[tokio::main]
async fn main() {
    lock_examples::show_lock_events();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, url, label] = &args[..]
        && flag == "--worker"
    {
        return worker(url, label).await;
    }
    let (url, _server) = redis_url_or_private_server();
    let locker = Locker::connect(&url).await.expect("connect");
    let mut watch = locker
        .observe("scheduler")
        .with_fallback(Duration::from_millis(100));
    let mut workers = spawn_workers(&url);
    let leader_of = |workers: &[(String, Child)], pid: Option<u32>| {
        workers.iter().position(|(_, c)| Some(c.id()) == pid)
    };
    let mut killed: Option<Instant> = None;
    loop {
        let info = watch.changed().await.expect("watch");
        let pid = info.as_ref().and_then(|i| i.holder.as_ref()).map(|h| h.pid);
        let Some(i) = leader_of(&workers, pid) else {
            println!("watcher: nobody leads");
            continue;
        };
        let label = workers[i].0.clone();
        match killed {
            None => {
                println!("watcher: {label} leads; killing it in 3 s");
                tokio::time::sleep(Duration::from_secs(3)).await;
                workers[i].1.kill().expect("SIGKILL the leader");
                workers[i].1.wait().expect("the leader is gone");
                workers.remove(i);
                killed = Some(Instant::now());
                println!("watcher: {label} killed (no release sent)");
            }
            Some(at) => {
                let after = at.elapsed().as_secs_f64();
                println!(
                    "watcher: {label} leads {after:.1} s after the crash; the schedule goes on"
                );
                tokio::time::sleep(Duration::from_secs(3)).await;
                break;
            }
        }
    }
    for (_, mut child) in workers {
        let _ = child.kill();
        let _ = child.wait();
    }
}
