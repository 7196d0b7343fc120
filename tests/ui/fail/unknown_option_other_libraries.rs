use lock_runtime::distributed_lock;

// Names from other lock libraries point at the option that means the same.
#[distributed_lock(key = "job", leaseTime = "10s", lock_at_least_for = "1s", retry = "2s")]
async fn job() {}

fn main() {}
