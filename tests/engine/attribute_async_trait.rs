//! `#[distributed_lock]` on `#[async_trait]` methods, against a real redis-server: the lock wraps
//! the body inside async-trait's boxed future, with the key rendered from the method's arguments
//! (pattern parameters too) and the locker read through `self`, whatever the receiver.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use lock_runtime::{LockError, LockOptions, Locker, distributed_lock};
use support::{Env, ms};

#[async_trait]
trait Billing {
    /// The lease's name and fence, as the body saw them.
    async fn bill(&self, tenant: &str, range: (u32, u32)) -> Result<(String, u64), LockError>;
    async fn close(self: Arc<Self>) -> Result<u32, LockError>;
    async fn tick(&self);

    /// A default method of the trait, locked as well.
    #[distributed_lock(name = "audit:{tenant}", ttl = "5s", locker = self.locker(), guard = lease)]
    async fn audit(&self, tenant: String) -> Result<String, LockError> {
        Ok(lease.name().to_owned())
    }

    fn locker(&self) -> &Locker;
}

struct Ledger {
    locker: Locker,
    ticks: AtomicU32,
}

#[async_trait]
impl Billing for Ledger {
    #[distributed_lock(name = "bill:{tenant}:{low}-{high}", ttl = "5s", locker = self.locker, guard = lease)]
    async fn bill(
        &self,
        tenant: &str,
        (low, high): (u32, u32),
    ) -> Result<(String, u64), LockError> {
        tokio::task::yield_now().await;
        Ok((lease.name().to_owned(), lease.fence()))
    }

    #[distributed_lock(name = "close", ttl = "5s", locker = self.locker)]
    async fn close(self: Arc<Self>) -> Result<u32, LockError> {
        Ok(self.ticks.load(Ordering::SeqCst))
    }

    #[distributed_lock(name = "tick", ttl = "5s", locker = self.locker)]
    async fn tick(&self) {
        self.ticks.fetch_add(1, Ordering::SeqCst);
    }

    fn locker(&self) -> &Locker {
        &self.locker
    }
}

#[tokio::test]
async fn async_trait_methods_run_under_the_lock() {
    let env = Env::start().await;
    let ledger = Arc::new(Ledger {
        locker: env.locker.clone(),
        ticks: AtomicU32::new(0),
    });

    let (name, fence) = ledger.bill("acme", (1, 2)).await.unwrap();
    assert_eq!(name, "bill:acme:1-2");
    let (_, next) = ledger.bill("acme", (1, 2)).await.unwrap();
    assert!(next > fence, "a new acquisition gets a higher fence");
    assert!(!env.exists(&env.key("bill:acme:1-2")).await, "released");
    assert_eq!(ledger.audit("acme".into()).await.unwrap(), "audit:acme");

    // Held elsewhere: the method reports Busy through its own error type, and the unit method
    // logs and returns without running its body.
    let held = env
        .locker
        .acquire("bill:acme:1-2", &LockOptions::new(ms(5_000)))
        .await
        .unwrap();
    let err = ledger.bill("acme", (1, 2)).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    held.release().await.unwrap();
    let tick = env
        .locker
        .acquire("tick", &LockOptions::new(ms(5_000)))
        .await
        .unwrap();
    ledger.tick().await;
    assert_eq!(ledger.ticks.load(Ordering::SeqCst), 0);
    tick.release().await.unwrap();
    ledger.tick().await;
    assert_eq!(ledger.clone().close().await.unwrap(), 1);
}
