use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "30s", renew = "0s")]
async fn job() {}

fn main() {}
