//! A scheduled job that must run once per tick across the cluster.
//!
//! Run: `cargo run --example scheduled_job` (uses `REDIS_URL` when set, else a private redis-server).
//!
//! Four workers stand in for four machines, each with its own `Locker` (its own connections).
//! They tick every second, with clocks up to 120 ms apart. With `min_hold`, the first worker to
//! tick keeps the lock for 800 ms even though its job takes 20 ms, so the late workers find it
//! held and skip: exactly one run per tick. Without `min_hold`, late workers run it again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lock_runtime::testing::redis_url_or_private_server;
use lock_runtime::{Locker, distributed_lock};

struct Worker {
    id: u32,
    locker: Locker,
    runs: Arc<AtomicU32>,
}

impl Worker {
    /// Runs at most once per tick cluster-wide; a worker that finds it held logs and returns.
    #[distributed_lock(name = "daily-report", ttl = "5s", min_hold = "800ms", locker = self.locker)]
    async fn send_report(&self, tick: u32) {
        self.runs.fetch_add(1, Ordering::SeqCst);
        println!("  tick {tick}: worker {} sends the report", self.id);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    /// The same job without `min_hold`: the lock is gone as soon as the 20 ms body ends.
    #[distributed_lock(name = "daily-report-unguarded", ttl = "5s", locker = self.locker)]
    async fn send_report_without_min_hold(&self, tick: u32) {
        self.runs.fetch_add(1, Ordering::SeqCst);
        println!("  tick {tick}: worker {} sends the report", self.id);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() {
    lock_suite::show_lock_events();
    let (url, _server) = redis_url_or_private_server();
    for guarded in [true, false] {
        println!(
            "{}",
            if guarded {
                "with min_hold = 800ms:"
            } else {
                "without min_hold:"
            }
        );
        let mut workers = Vec::new();
        for id in 0..4 {
            let locker = Locker::connect(&url).await.expect("connect");
            workers.push(Arc::new(Worker {
                id,
                locker,
                runs: Arc::new(AtomicU32::new(0)),
            }));
        }
        for tick in 0..3 {
            let mut handles = Vec::new();
            let before: u32 = workers.iter().map(|w| w.runs.load(Ordering::SeqCst)).sum();
            for worker in &workers {
                let worker = Arc::clone(worker);
                handles.push(tokio::spawn(async move {
                    // Machines' clocks and schedulers are never exactly aligned.
                    tokio::time::sleep(Duration::from_millis(40 * u64::from(worker.id))).await;
                    if guarded {
                        worker.send_report(tick).await;
                    } else {
                        worker.send_report_without_min_hold(tick).await;
                    }
                }));
            }
            for h in handles {
                h.await.expect("worker");
            }
            let after: u32 = workers.iter().map(|w| w.runs.load(Ordering::SeqCst)).sum();
            println!("  tick {tick}: {} run(s)", after - before);
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
    }
}
