//! Methods: `&self`, `&mut self`, `self: Arc<Self>`, a by-value `self`, and a locker read
//! through `self` while the body also uses `self`.
use std::sync::Arc;

use lock_runtime::{LockError, Locker, distributed_lock};

struct Service {
    locker: Locker,
    runs: u64,
}

impl Service {
    #[distributed_lock(name = "svc:{id}", ttl = "10s", locker = self.locker)]
    async fn by_ref(&self, id: u32) -> Result<u64, LockError> {
        Ok(self.runs + u64::from(id))
    }

    #[distributed_lock(name = "svc:{id}", ttl = "10s", locker = self.locker, guard = lease)]
    async fn by_mut(&mut self, id: u32) -> Result<(), LockError> {
        self.runs += lease.fence() + u64::from(id);
        Ok(())
    }

    #[distributed_lock(name = "svc-arc", ttl = "10s", locker = self.locker)]
    async fn by_arc(self: Arc<Self>) -> Result<Arc<Self>, LockError> {
        Ok(self)
    }

    #[distributed_lock(name = "svc-owned", ttl = "10s", locker = self.locker.clone())]
    async fn by_value(self) -> Result<Self, LockError> {
        Ok(self)
    }

    #[distributed_lock(name = "svc-default", ttl = "10s")]
    async fn default_locker(&self) {
        let _ = self.runs;
    }
}

fn main() {
    let _ = Service::by_ref;
    let _ = Service::by_mut;
    let _ = Service::by_arc;
    let _ = Service::by_value;
    let _ = Service::default_locker;
}
