//! `impl Trait` in the return type cannot be named in a turbofish: the macro leaves it to inference.
use std::fmt::Display;

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(name = "shown", ttl = "5s")]
async fn shown() -> Result<impl Display, LockError> {
    Ok::<_, LockError>(42)
}

#[distributed_lock(name = "items", ttl = "5s")]
async fn items(n: u32) -> Result<Vec<impl Display>, std::io::Error> {
    let v: Vec<u32> = (0..n).collect();
    Ok(v)
}

fn main() {
    drop(shown());
    drop(items(3));
}
