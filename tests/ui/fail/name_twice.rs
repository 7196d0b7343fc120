use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(name = ["account:{from}", "account:{from}"], ttl = "30s")]
async fn same_twice(from: u32) -> Result<(), LockError> {
    let _ = from;
    Ok(())
}

#[distributed_lock(name = ["account:{from}", "account:{to}"], ttl = "30s", fail_open)]
async fn fail_open_over_two(from: u32, to: u32) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(name = [], ttl = "30s")]
async fn none() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
