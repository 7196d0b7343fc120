use lock_runtime::distributed_lock;

#[distributed_lock(name = "catalog", ttl = "30s", shared, permits = 3)]
async fn both() {}

#[distributed_lock(name = "catalog", ttl = "30s", shared = 1)]
async fn not_a_flag() {}

fn main() {}
