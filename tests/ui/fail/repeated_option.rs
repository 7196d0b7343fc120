use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "10s", wait = "1s", ttl = "20s")]
async fn job() {}

fn main() {}
