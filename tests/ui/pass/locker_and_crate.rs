//! `locker = ` a static and a reference; `crate = ` a path to a re-export of the runtime.
use std::sync::LazyLock;

use lock_runtime::{LockError, Locker, distributed_lock};

static LOCKER: LazyLock<Locker> = LazyLock::new(|| {
    Locker::builder()
        .url("redis://127.0.0.1:6379")
        .build()
        .expect("valid url")
});

mod reexport {
    pub use lock_runtime as locks;
}

#[distributed_lock(name = "static", ttl = "5s", locker = LOCKER)]
async fn with_static() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(name = "by-ref", ttl = "5s", locker = &*LOCKER)]
async fn with_ref() -> Result<(), LockError> {
    Ok(())
}

fn pick(locker: &Locker) -> &Locker {
    locker
}

#[distributed_lock(name = "call", ttl = "5s", locker = *pick(&LOCKER))]
async fn with_call() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(name = "renamed", ttl = "5s", crate = crate::reexport::locks)]
async fn renamed_crate() -> Result<(), reexport::locks::LockError> {
    Ok(())
}

fn main() {
    drop(with_static());
    drop(with_ref());
    drop(with_call());
    drop(renamed_crate());
}
