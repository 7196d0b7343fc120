use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "10s", renew = "6s")]
async fn job() {}

fn main() {}
