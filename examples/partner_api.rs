//! At most N calls at once to a rate-limited partner, across every process: `permits = N`.
//!
//! Run: `cargo xtask example partner_api` or
//! `cargo run -p lock-examples --example partner_api` (uses `REDIS_URL` when set, else a private
//! redis-server).
//!
//! The partner allows 3 calls at a time. 10 tasks each make 4 calls through
//! `#[distributed_lock(.., permits = 3)]`; each call holds one permit (with its own lease and
//! fence) while it talks to the partner. The example counts the calls in flight and shows that
//! never more than 3 ran at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, Locker, distributed_lock};
use lock_testing::redis_url_or_private_server;

/// Calls in flight now, and the most seen.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static MOST: AtomicUsize = AtomicUsize::new(0);

/// One call to the partner; waits up to 10 s for a free permit.
#[distributed_lock(name = "partner-api", ttl = "30s", permits = 3, wait = "10s", guard = permit)]
async fn call_partner(task: u32, call: u32) -> Result<(), LockError> {
    let now = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    MOST.fetch_max(now, Ordering::SeqCst);
    println!(
        "task {task} call {call}: {now} in flight (fence {})",
        permit.fence()
    );
    // Stands for the partner's answer.
    tokio::time::sleep(Duration::from_millis(50)).await;
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::main]
async fn main() {
    lock_examples::show_lock_events();
    let (url, _server) = redis_url_or_private_server();
    let locker = Locker::connect(&url).await.expect("connect");
    lock_runtime::set_default_locker(locker).expect("first default locker");
    let tasks: Vec<_> = (0..10)
        .map(|task| {
            tokio::spawn(async move {
                for call in 0..4 {
                    call_partner(task, call)
                        .await
                        .expect("a permit within the wait");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let most = MOST.load(Ordering::SeqCst);
    println!("40 calls made; at most {most} ran at once (the partner allows 3)");
    if most > 3 {
        std::process::exit(1);
    }
}
