//! The manual API: `Locker::acquire` / `Lease::release`, and `Locker::run`.
//!
//! Run: `cargo xtask example manual` or `cargo run -p lock-examples --example manual` (uses
//! `REDIS_URL` when set, else a private redis-server).
//!
//! Shows: a second taker is refused while the lease is held; a waiter is woken by the release;
//! fences grow with each acquisition; `run` cancels a body that outlives `max_exec`.

use std::time::Duration;

use lock_runtime::{LockError, LockOptions, Locker};
use lock_testing::redis_url_or_private_server;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    lock_examples::show_lock_events();
    // A private server unless REDIS_URL points at one (kept alive until the end of main).
    let (url, _server) = redis_url_or_private_server();
    let locker = Locker::connect(&url).await?;
    println!("connected to {url}");

    let opts = LockOptions::new(Duration::from_secs(10));
    let lease = locker.acquire("invoice:42", &opts).await?;
    println!("held `{}` with fence {}", lease.name(), lease.fence());

    // Someone else trying once is refused at once.
    match locker.acquire("invoice:42", &opts).await {
        Err(LockError::Busy { .. }) => println!("a second taker is refused while it is held"),
        other => println!("unexpected: {other:?}"),
    }

    // A waiter is woken by the release message, not by polling.
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(5));
            let started = tokio::time::Instant::now();
            let lease = locker.acquire("invoice:42", &opts).await?;
            println!(
                "the waiter got it after {:?}, fence {}",
                started.elapsed(),
                lease.fence()
            );
            lease.release().await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    lease.release().await?;
    waiter.await.expect("waiter task")?;

    // `run`: the whole life of one locked call; the body is cancelled past max_exec.
    let short = LockOptions::new(Duration::from_secs(2)).with_max_exec(Duration::from_millis(300));
    let result = locker
        .run("report", &short, async |lease| {
            println!("running under fence {}", lease.fence());
            tokio::time::sleep(Duration::from_secs(5)).await;
        })
        .await;
    match result {
        Err(e @ LockError::MaxExecExceeded { .. }) => println!("cancelled as promised: {e}"),
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
