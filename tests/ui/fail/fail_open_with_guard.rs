use lock_runtime::{Lease, LockError, distributed_lock};

#[distributed_lock(name = "warm", ttl = "30s", fail_open, guard = lease)]
async fn with_guard() -> Result<u64, LockError> {
    let lease: &Lease = lease;
    Ok(lease.fence())
}

#[distributed_lock(name = "warm", ttl = "30s", permits = 3, fail_open = true)]
async fn with_permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(name = "warm", ttl = "30s", fail_open = "yes")]
async fn not_a_flag() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
