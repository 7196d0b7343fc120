//! Fencing tokens: why a lease alone cannot protect a write, and how the fence does.
//!
//! Run: `cargo xtask example fencing` or `cargo run -p lock-examples --example fencing` (uses
//! `REDIS_URL` when set, else a private redis-server).
//!
//! Holder A takes the lock and then stalls (a GC pause, a stopped VM: here, a blocked thread)
//! for longer than its ttl. Its key expires, B takes the lock with a higher fence and writes.
//! When A wakes up it still believes it may write — but the storage remembers the highest fence
//! it has seen and refuses A's stale write.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockOptions, Locker};
use lock_testing::redis_url_or_private_server;

/// A storage that refuses writes whose fence is not above every fence it has seen.
#[derive(Default)]
struct FencedStore {
    state: Mutex<(u64, Vec<String>)>,
}

impl FencedStore {
    fn write(&self, fence: u64, value: &str) -> Result<(), String> {
        let mut state = self.state.lock().unwrap();
        if fence <= state.0 {
            return Err(format!(
                "refused `{value}`: fence {fence} <= {} already seen",
                state.0
            ));
        }
        state.0 = fence;
        state.1.push(value.to_owned());
        Ok(())
    }
}

fn main() {
    lock_examples::show_lock_events();
    let (url, _server) = redis_url_or_private_server();
    let store = Arc::new(FencedStore::default());
    let ttl = Duration::from_millis(300);

    // Holder A on its own single-threaded runtime, as its own "process".
    let (a_store, a_url) = (Arc::clone(&store), url.clone());
    let (holds_tx, holds_rx) = std::sync::mpsc::channel();
    let holder_a = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let locker = Locker::connect(&a_url).await.unwrap();
            let lease = locker
                .acquire("ledger", &LockOptions::new(ttl))
                .await
                .unwrap();
            println!("A holds the lock with fence {}", lease.fence());
            holds_tx.send(()).unwrap();
            // A stalls: nothing on this runtime runs, not even its renewal watchdog.
            std::thread::sleep(ttl * 3);
            println!("A wakes up; lease still held locally? {}", lease.is_held());
            match a_store.write(lease.fence(), "written by A") {
                Ok(()) => println!("A's write accepted (unsafe!)"),
                Err(e) => println!("A's write {e}"),
            }
        });
    });

    holds_rx.recv().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let locker = Locker::connect(&url).await.unwrap();
        let opts = LockOptions::new(ttl).with_wait(Duration::from_secs(2));
        // B waits until A's key expires, then writes with a higher fence.
        let lease = locker.acquire("ledger", &opts).await.unwrap();
        println!(
            "B holds the lock with fence {} after A's key expired",
            lease.fence()
        );
        store.write(lease.fence(), "written by B").unwrap();
        println!("B's write accepted");
        lease.release().await.unwrap();
    });
    holder_a.join().unwrap();
    println!("store contents: {:?}", store.state.lock().unwrap().1);
}
