//! The design's example: a free fn returning `Result`, a guard, `?` through `From`, early return.
use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

struct Summary {
    fence: u64,
    total: u32,
}

#[distributed_lock(name = "invoice:{tenant}", ttl = "30s", wait = "5s", guard = lease)]
async fn close_books(tenant: &str, amount: &str) -> Result<Summary, AppError> {
    // `?` converts into the declared error type, so the closure's return type is known.
    let total: u32 = amount.parse()?;
    if total == 0 {
        return Ok(Summary {
            fence: lease.fence(),
            total,
        });
    }
    tokio::task::yield_now().await;
    Ok(Summary {
        fence: lease.fence(),
        total,
    })
}

fn main() {
    // Building the future runs nothing: no Redis needed.
    let future = close_books("acme", "12");
    drop(future);
    let _ = |s: Summary| (s.fence, s.total);
}
