use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "30s", min_hold = "1m")]
async fn job() {}

fn main() {}
