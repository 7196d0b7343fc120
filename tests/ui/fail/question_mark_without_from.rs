use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

// `?` on an error that AppError has no `From` for.
#[distributed_lock(name = "job:{id}", ttl = "10s")]
async fn job(id: u32, amount: &str) -> Result<u32, AppError> {
    let amount: u32 = amount.parse()?;
    Ok(amount + id)
}

fn main() {}
