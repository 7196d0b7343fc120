use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "10s", renew = "1500us")]
async fn job() {}

fn main() {}
