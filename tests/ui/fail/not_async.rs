use lock_runtime::distributed_lock;

#[distributed_lock(name = "job:{id}", ttl = "10s")]
fn job(id: u32) -> Result<(), lock_runtime::LockError> {
    Ok(())
}

fn main() {}
