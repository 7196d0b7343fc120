//! Return sites in the body coerce to the declared type as in a plain `async fn`: early
//! `return`, deref coercion, unsized coercion to `Box<dyn ..>`, `?` into `Box<dyn Error>`.
use std::error::Error;
use std::fmt::Display;

use lock_runtime::{LockError, distributed_lock};

struct Names {
    first: String,
}

impl Names {
    #[distributed_lock(name = "names", ttl = "5s")]
    async fn first(&self, fallback: bool) -> Result<&str, LockError> {
        if fallback {
            return Ok("none");
        }
        if self.first.is_empty() {
            return Ok(&self.first);
        }
        Ok(&self.first)
    }
}

#[distributed_lock(name = "shape:{n}", ttl = "5s")]
async fn shape(n: u8) -> Result<Box<dyn Display>, LockError> {
    if n == 0 {
        return Ok(Box::new("zero"));
    }
    Ok(Box::new(n))
}

#[distributed_lock(name = "dyn-error:{input}", ttl = "5s")]
async fn dyn_error(input: &str) -> Result<u32, Box<dyn Error + Send + Sync>> {
    if input.is_empty() {
        return Err("empty input".into());
    }
    let n: u32 = input.parse()?;
    Ok(n)
}

#[distributed_lock(name = "inferred", ttl = "5s")]
async fn impl_trait_inferred() -> Result<impl Display, LockError> {
    Ok(42)
}

fn main() {
    let names = Names {
        first: String::new(),
    };
    drop(names.first(true));
    drop(shape(1));
    drop(dyn_error("1"));
    drop(impl_trait_inferred());
}
