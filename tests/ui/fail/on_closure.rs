// rustc itself rejects attribute macros on expressions before `#[distributed_lock]` runs, so
// this shows rustc's errors; the attribute's own "goes on an `async fn`" message is in on_struct.
use lock_runtime::distributed_lock;

fn main() {
    let job = #[distributed_lock(name = "job", ttl = "10s")]
    async || {};
    drop(job);
}
