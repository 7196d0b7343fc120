//! `#[distributed_lock]` on the methods of an `#[async_trait]` impl, and on a default method of
//! an `#[async_trait]` trait: async-trait runs first and hands the attribute a `fn` returning
//! `Pin<Box<dyn Future<Output = R> + Send>>`; the lock wraps the body inside that future. Key
//! templates (pattern parameters too), `locker = self...` with any receiver, and `guard` work.
use std::sync::Arc;

use async_trait::async_trait;
use lock_runtime::{LockError, Locker, distributed_lock};

#[async_trait]
trait Job {
    fn locker(&self) -> &Locker;

    async fn by_ref(&self, tenant: &str, n: u32) -> Result<u32, LockError>;
    async fn by_arc(self: Arc<Self>, pair: (u32, u32)) -> Result<u32, LockError>;
    async fn by_mut(&mut self);
    async fn by_value(self) -> Result<Self, LockError>
    where
        Self: Sized;

    #[distributed_lock(name = "default:{tag}", ttl = "5s", locker = self.locker(), guard = lease)]
    async fn default_method(&self, tag: String) -> Result<u64, LockError> {
        Ok(lease.fence() + u64::try_from(tag.len()).unwrap_or(0))
    }
}

struct Billing {
    locker: Locker,
    count: u32,
}

#[async_trait]
impl Job for Billing {
    fn locker(&self) -> &Locker {
        &self.locker
    }

    #[distributed_lock(name = "bill:{tenant}:{n}", ttl = "5s", locker = self.locker, guard = lease)]
    async fn by_ref(&self, tenant: &str, n: u32) -> Result<u32, LockError> {
        let _ = lease.fence();
        tokio::task::yield_now().await;
        Ok(self.count + n + u32::try_from(tenant.len()).unwrap_or(0))
    }

    // A pattern parameter: async-trait binds `a` and `b` inside the future.
    #[distributed_lock(name = "pair:{a}-{b}", ttl = "5s", locker = self.locker)]
    async fn by_arc(self: Arc<Self>, (a, b): (u32, u32)) -> Result<u32, LockError> {
        Ok(self.count + a + b)
    }

    #[distributed_lock(name = "unit", ttl = "5s", locker = self.locker)]
    async fn by_mut(&mut self) {
        self.count += 1;
    }

    #[distributed_lock(name = "owned", ttl = "5s", locker = self.locker.clone())]
    async fn by_value(self) -> Result<Self, LockError> {
        Ok(self)
    }
}

// `?Send` futures work the same way.
#[async_trait(?Send)]
trait Local {
    async fn local(&self, id: u8) -> Result<u8, LockError>;
}

#[async_trait(?Send)]
impl Local for Billing {
    #[distributed_lock(name = "local:{id}", ttl = "5s", locker = self.locker)]
    async fn local(&self, id: u8) -> Result<u8, LockError> {
        let shared = std::rc::Rc::new(id);
        tokio::task::yield_now().await;
        Ok(*shared)
    }
}

fn assert_send<T: Send>(_: &T) {}

// Type-checks the calls without running them (running would need a Redis server).
fn calls(mut billing: Billing) {
    assert_send(&billing.by_ref("acme", 1));
    assert_send(&billing.default_method("tag".into()));
    drop(billing.local(1));
    assert_send(&billing.by_mut());
    let billing = Arc::new(billing);
    assert_send(&billing.clone().by_arc((1, 2)));
    let _ = Arc::try_unwrap(billing).map(Job::by_value);
}

fn main() {
    let _ = calls;
}
