use lock_runtime::distributed_lock;

#[derive(Debug)]
enum AppError {
    NotFound,
}

#[distributed_lock(name = "job", ttl = "10s")]
async fn job() -> Result<u32, AppError> {
    Err(AppError::NotFound)
}

fn main() {}
