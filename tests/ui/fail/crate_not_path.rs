use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "10s", crate = "lock_runtime")]
async fn job() {}

fn main() {}
