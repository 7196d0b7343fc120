use lock_runtime::distributed_lock;

#[distributed_lock(name, ttl = "10s")]
async fn job() {}

fn main() {}
