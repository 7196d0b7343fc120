use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "10s", guard = "lease")]
async fn quoted() {}

#[distributed_lock(name = "job", ttl = "10s", guard = self)]
async fn keyword() {}

fn main() {}
