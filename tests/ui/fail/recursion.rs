use lock_runtime::{LockError, distributed_lock};

// A locked function that awaits a call of itself: one error at the call, with the fix.
#[distributed_lock(name = "countdown:{n}", ttl = "10s")]
async fn countdown(n: u32) -> Result<u32, LockError> {
    if n == 0 {
        return Ok(0);
    }
    Ok(countdown(n - 1).await? + 1)
}

struct Tree;

impl Tree {
    #[distributed_lock(name = "walk", ttl = "10s")]
    async fn walk(&self, depth: u32) -> Result<(), LockError> {
        if depth > 0 {
            self.walk(depth - 1).await?;
        }
        Ok(())
    }

    #[distributed_lock(name = "visit", ttl = "10s")]
    async fn visit(depth: u32) {
        if depth > 0 {
            Self::visit(depth - 1).await;
        }
    }
}

fn main() {}
