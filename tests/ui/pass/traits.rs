//! Async fns in trait impls, and a trait's default method with a body.
use lock_runtime::{LockError, distributed_lock};

trait Job {
    fn id(&self) -> u32;

    async fn run(&self) -> Result<u32, LockError>;

    #[distributed_lock(name = "default:{tag}", ttl = "5s")]
    async fn run_default(&self, tag: &str) -> Result<u32, LockError> {
        Ok(self.id() + u32::try_from(tag.len()).unwrap_or(0))
    }
}

struct Daily;

impl Job for Daily {
    fn id(&self) -> u32 {
        7
    }

    #[distributed_lock(name = "daily", ttl = "5s", guard = lease)]
    async fn run(&self) -> Result<u32, LockError> {
        let _ = lease.name();
        Ok(self.id())
    }
}

fn main() {
    drop(Daily.run());
    drop(Daily.run_default("x"));
}
