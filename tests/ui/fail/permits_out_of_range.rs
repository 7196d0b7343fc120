use lock_runtime::distributed_lock;

#[distributed_lock(name = "api", ttl = "30s", permits = 0)]
async fn none() {}

#[distributed_lock(name = "api", ttl = "30s", permits = "5")]
async fn quoted() {}

fn main() {}
