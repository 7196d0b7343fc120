//! Request handlers that must not work on the same entity twice at once.
//!
//! Run: `cargo run --example http_handler` (uses `REDIS_URL` when set, else a private redis-server).
//!
//! `withdraw` does a read-modify-write on an account balance with a slow step in between, as a
//! handler calling other services would. The lock name comes from the argument
//! (`account:{account_id}`), so requests for the same account serialise while requests for
//! different accounts run in parallel. Plain tokio tasks stand in for an HTTP server's requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::testing::redis_url_or_private_server;
use lock_runtime::{LockError, Locker, distributed_lock};

/// The handler's error type: lock failures become a 409/503-style answer.
#[derive(Debug)]
enum ApiError {
    Lock(LockError),
    InsufficientFunds,
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        ApiError::Lock(e)
    }
}

#[derive(Default)]
struct Accounts(Mutex<HashMap<u64, u64>>);

impl Accounts {
    fn balance(&self, id: u64) -> u64 {
        self.0.lock().unwrap().get(&id).copied().unwrap_or(0)
    }
    fn set(&self, id: u64, value: u64) {
        self.0.lock().unwrap().insert(id, value);
    }
}

/// Uses the process default locker (set in `main`).
#[distributed_lock(name = "account:{account_id}", ttl = "2s", wait = "5s")]
async fn withdraw(account_id: u64, amount: u64, accounts: Arc<Accounts>) -> Result<u64, ApiError> {
    let balance = accounts.balance(account_id);
    // A slow step between the read and the write: without the lock, concurrent requests would
    // all read the same balance and the account would lose updates.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let left = balance
        .checked_sub(amount)
        .ok_or(ApiError::InsufficientFunds)?;
    accounts.set(account_id, left);
    Ok(left)
}

#[tokio::main]
async fn main() {
    lock_suite::show_lock_events();
    let (url, _server) = redis_url_or_private_server();
    lock_runtime::set_default_locker(Locker::connect(&url).await.expect("connect"))
        .expect("first default");
    let accounts = Arc::new(Accounts::default());
    for id in [1, 2, 3] {
        accounts.set(id, 1_000);
    }
    // 20 concurrent requests of 10 on each of 3 accounts.
    let started = tokio::time::Instant::now();
    let mut requests = Vec::new();
    for _ in 0..20 {
        for id in [1, 2, 3] {
            requests.push(tokio::spawn(withdraw(id, 10, Arc::clone(&accounts))));
        }
    }
    let mut failed = 0;
    for r in requests {
        match r.await.expect("request task") {
            Ok(_) => {}
            Err(ApiError::Lock(e)) => {
                failed += 1;
                println!("request failed: {e}");
            }
            Err(ApiError::InsufficientFunds) => {
                failed += 1;
                println!("request failed: insufficient funds");
            }
        }
    }
    let took = started.elapsed();
    for id in [1, 2, 3] {
        println!(
            "account {id}: balance {} (expected {})",
            accounts.balance(id),
            1_000 - 20 * 10
        );
    }
    println!(
        "60 requests, {failed} failed, in {took:?}: each account serialised its 20 requests \
         (>= 200 ms each), the 3 accounts ran side by side"
    );
}
