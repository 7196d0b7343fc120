use async_trait::async_trait;
use lock_runtime::{LockError, distributed_lock};

#[async_trait]
trait Job {
    async fn run(&self) -> Result<(), LockError>;
}

struct Daily;

// The attribute goes on the methods, whichever order it is written in with `#[async_trait]`.
#[distributed_lock(name = "daily", ttl = "5s")]
#[async_trait]
impl Job for Daily {
    async fn run(&self) -> Result<(), LockError> {
        Ok(())
    }
}

struct Weekly;

#[async_trait]
#[distributed_lock(name = "weekly", ttl = "5s")]
impl Job for Weekly {
    async fn run(&self) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
