use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "30s", max_exec = "0ms")]
async fn job() {}

fn main() {}
