use lock_runtime::distributed_lock;

#[derive(Debug)]
enum AppError {
    NotFound,
}

// The error type is blamed, in the library's words.
#[distributed_lock(name = "job", ttl = "10s")]
async fn job() -> Result<u32, AppError> {
    Err(AppError::NotFound)
}

#[distributed_lock(name = "format", ttl = "10s")]
async fn format() -> Result<(), std::fmt::Error> {
    Ok(())
}

// A type with many `From` impls of its own: none of them is listed.
#[distributed_lock(name = "text", ttl = "10s")]
async fn text() -> Result<(), String> {
    Ok(())
}

// Behind an alias the error type is not written out: the whole return type is blamed.
type AppResult<T> = Result<T, AppError>;

#[distributed_lock(name = "aliased", ttl = "10s")]
async fn aliased() -> AppResult<u32> {
    Ok(1)
}

fn main() {}
