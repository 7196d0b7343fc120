use lock_runtime::{LockError, distributed_lock};

trait Job {
    #[distributed_lock(name = "job", ttl = "10s")]
    async fn run(&self) -> Result<(), LockError>;
}

fn main() {}
