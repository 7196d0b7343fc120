//! The expansion is lint-clean under strict settings (trybuild runs rustc lints; clippy is
//! covered by tests/engine/attribute_lints.rs).
#![deny(warnings)]
#![deny(clippy::all, clippy::pedantic)]

use lock_runtime::{LockError, Locker, distributed_lock};

struct Repo {
    locker: Locker,
}

impl Repo {
    #[distributed_lock(name = "repo:{id}", ttl = "30s", locker = self.locker, guard = lease)]
    async fn save(&self, id: u64) -> Result<u64, LockError> {
        Ok(id + lease.fence())
    }
}

#[distributed_lock(name = "job:{a}:{b}", ttl = "2s", max_exec = "1s", renew = "500ms")]
async fn job(a: u32, b: &str) -> Result<usize, LockError> {
    Ok(b.len() + a as usize)
}

#[distributed_lock(name = "unit", ttl = "2s")]
async fn unit() {}

fn main() {
    drop(job(1, "x"));
    drop(unit());
    let _ = Repo::save;
}
