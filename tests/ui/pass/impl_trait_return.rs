//! `impl Trait` in the return type cannot be named in a turbofish: the macro writes `_` in its
//! place, so the rest of the type (the error type for `?`) still guides inference.
use std::fmt::Display;

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

#[distributed_lock(name = "shown", ttl = "5s")]
async fn shown() -> Result<impl Display, LockError> {
    Ok(42)
}

#[distributed_lock(name = "parsed:{input}", ttl = "5s")]
async fn parsed(input: &str) -> Result<impl Display + '_, AppError> {
    let n: u32 = input.parse()?;
    if n == 0 {
        return Ok(input.to_owned());
    }
    Ok(n.to_string())
}

#[distributed_lock(name = "items", ttl = "5s")]
async fn items(n: u32) -> Result<Vec<impl Display>, std::io::Error> {
    Ok((0..n).collect::<Vec<u32>>())
}

fn main() {
    drop(shown());
    drop(parsed("1"));
    drop(items(3));
}
