use lock_runtime::{LockError, distributed_lock};

// `?` on an Option in a function returning Result: rustc's message speaks of the function.
#[distributed_lock(name = "job:{id}", ttl = "10s")]
async fn job(id: u32, found: Option<u32>) -> Result<u32, LockError> {
    let value = found?;
    Ok(value + id)
}

fn main() {}
