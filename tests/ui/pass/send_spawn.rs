//! The future of a locked fn is `Send` when its body's is: it can be `tokio::spawn`ed.
use std::sync::Arc;

use lock_runtime::{LockError, Locker, distributed_lock};

#[distributed_lock(name = "job:{id}", ttl = "10s", guard = lease)]
async fn job(id: u64, label: String) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    Ok(id + lease.fence() + label.len() as u64)
}

struct Worker {
    locker: Locker,
}

impl Worker {
    #[distributed_lock(name = "worker", ttl = "10s", locker = self.locker)]
    async fn work(self: Arc<Self>) {
        tokio::task::yield_now().await;
    }
}

fn assert_send<T: Send + 'static>(_: &T) {}

fn main() {
    let future = job(1, "x".into());
    assert_send(&future);
    drop(future);
    // Type-checks a spawn without running it (running would need a Redis server).
    let _spawn = || tokio::spawn(job(2, "y".into()));
    let _spawn_method = |w: Arc<Worker>| tokio::spawn(w.work());
}
