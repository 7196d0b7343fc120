use lock_runtime::distributed_lock;

#[distributed_lock(name = "job:{id", ttl = "10s")]
async fn job(id: u32) {}

fn main() {}
