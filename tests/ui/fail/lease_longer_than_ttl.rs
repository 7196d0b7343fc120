use lock_runtime::distributed_lock;

#[distributed_lock(name = "nightly", ttl = "30s", lease = "1m")]
async fn nightly() {}

#[distributed_lock(name = "nightly", ttl = "2h", lease = "2ms")]
async fn too_short() {}

fn main() {}
