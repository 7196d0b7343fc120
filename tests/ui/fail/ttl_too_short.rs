use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "2ms")]
async fn job() {}

#[distributed_lock(name = "job", ttl = "0s")]
async fn zero() {}

fn main() {}
