use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = 10)]
async fn job() {}

fn main() {}
