use lock_runtime::distributed_lock;

#[derive(Debug)]
enum AppError {
    NotFound,
}

#[distributed_lock(name = "job", ttl = "10s")]
async fn job() -> Result<u32, AppError> {
    Err(AppError::NotFound)
}

// The error type is blamed, at its last name.
#[distributed_lock(name = "format", ttl = "10s")]
async fn format() -> Result<(), std::fmt::Error> {
    Ok(())
}

fn main() {}
