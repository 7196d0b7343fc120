//! A locked function may call itself through `Box::pin`, as any recursive `async fn`; its
//! future stays `Send`.
use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(name = "countdown:{n}", ttl = "10s")]
async fn countdown(n: u32) -> Result<u32, LockError> {
    if n == 0 {
        return Ok(0);
    }
    Ok(Box::pin(countdown(n - 1)).await? + 1)
}

struct Tree;

impl Tree {
    #[distributed_lock(name = "walk", ttl = "10s")]
    async fn walk(&self, depth: u32) -> Result<(), LockError> {
        if depth > 0 {
            Box::pin(self.walk(depth - 1)).await?;
        }
        Ok(())
    }
}

// A closure of the same name is not the function.
#[distributed_lock(name = "shadowed", ttl = "10s")]
async fn shadowed() -> Result<u32, LockError> {
    let shadowed = async |n: u32| n + 1;
    Ok(shadowed(1).await)
}

fn send<T: Send + 'static>(_: T) {}

static TREE: Tree = Tree;

fn main() {
    send(countdown(3));
    send(TREE.walk(2));
    send(shadowed());
}
