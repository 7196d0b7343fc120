use lock_runtime::distributed_lock;

#[distributed_lock(name = "job")]
async fn job() {}

fn main() {}
