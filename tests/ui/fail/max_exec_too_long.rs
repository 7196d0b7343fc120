use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "30s", max_exec = "30s")]
async fn job() {}

fn main() {}
