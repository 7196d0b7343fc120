//! Many readers or one writer, across every process: `shared`.
//!
//! Run: `cargo xtask example catalog` or `cargo run -p lock-examples --example catalog` (uses
//! `REDIS_URL` when set, else a private redis-server).
//!
//! A shop's catalogue is read by many handlers and rebuilt now and then. 8 tasks read it through
//! `#[distributed_lock(.., shared)]`, which lets readers in together; one task rebuilds it through
//! the same name without `shared`, which runs alone. The example counts who is inside and shows
//! that readers ran together and that the rebuild never ran beside anyone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, Locker, distributed_lock};
use lock_testing::redis_url_or_private_server;

static READERS: AtomicUsize = AtomicUsize::new(0);
static MOST_READERS: AtomicUsize = AtomicUsize::new(0);
static WRITERS: AtomicUsize = AtomicUsize::new(0);
/// Times the rebuild was inside with anyone else.
static OVERLAPS: AtomicUsize = AtomicUsize::new(0);

/// One read of the catalogue: beside other reads, never beside a rebuild.
#[distributed_lock(name = "catalog:{shop}", ttl = "30s", shared, wait = "10s")]
async fn read_catalog(shop: &str) -> Result<(), LockError> {
    let now = READERS.fetch_add(1, Ordering::SeqCst) + 1;
    MOST_READERS.fetch_max(now, Ordering::SeqCst);
    if WRITERS.load(Ordering::SeqCst) > 0 {
        OVERLAPS.fetch_add(1, Ordering::SeqCst);
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    READERS.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// The rebuild: alone, with a fence to hand to the storage it writes.
#[distributed_lock(name = "catalog:{shop}", ttl = "30s", wait = "10s", guard = lease)]
async fn rebuild_catalog(shop: &str) -> Result<(), LockError> {
    WRITERS.fetch_add(1, Ordering::SeqCst);
    if READERS.load(Ordering::SeqCst) > 0 {
        OVERLAPS.fetch_add(1, Ordering::SeqCst);
    }
    println!(
        "rebuilding the {shop} catalogue alone (fence {})",
        lease.fence()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    WRITERS.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::main]
async fn main() {
    lock_examples::show_lock_events();
    let (url, _server) = redis_url_or_private_server();
    let locker = Locker::connect(&url).await.expect("connect");
    lock_runtime::set_default_locker(locker).expect("first default locker");
    let mut tasks: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async {
                for _ in 0..5 {
                    read_catalog("eu").await.expect("a read within the wait");
                }
            })
        })
        .collect();
    tasks.push(tokio::spawn(async {
        for _ in 0..3 {
            rebuild_catalog("eu")
                .await
                .expect("the rebuild within the wait");
        }
    }));
    for task in tasks {
        task.await.expect("task");
    }
    let (most, overlaps) = (
        MOST_READERS.load(Ordering::SeqCst),
        OVERLAPS.load(Ordering::SeqCst),
    );
    println!(
        "40 reads and 3 rebuilds; up to {most} reads at once, {overlaps} rebuilds beside anyone"
    );
    if overlaps > 0 || most < 2 {
        std::process::exit(1);
    }
}
