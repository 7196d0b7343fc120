//! A scheduled job returning `()`: failures are logged by the runtime. Every duration option.
use lock_runtime::distributed_lock;

#[distributed_lock(
    name = "nightly-report",
    ttl = "1m 30s",
    max_exec = "1m",
    renew = "20s",
    wait = "0s",
    min_hold = "250ms"
)]
async fn nightly_report() {
    tokio::task::yield_now().await;
}

#[distributed_lock(name = "cleanup:{shard}", ttl = "10s")]
async fn cleanup(shard: u8) {
    if shard == 0 {
        return;
    }
    println!("cleaning {shard}");
}

fn main() {
    drop(nightly_report());
    drop(cleanup(3));
}
