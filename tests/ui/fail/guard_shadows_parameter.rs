use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(name = "job:{id}", ttl = "10s", guard = lease)]
async fn job(id: u32, lease: u64) -> Result<u64, LockError> {
    Ok(lease + u64::from(id))
}

fn main() {}
