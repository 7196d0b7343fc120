//! Visibility, doc comments, other attributes and inner attributes are kept as written.
#![deny(missing_docs)]
//! Crate docs.

use lock_runtime::{LockError, distributed_lock};

/// Public items.
pub mod jobs {
    use super::{LockError, distributed_lock};

    /// Documented and visible in the crate only.
    #[distributed_lock(name = "crate-only", ttl = "5s")]
    #[allow(clippy::unused_async)]
    pub(crate) async fn crate_only() -> Result<(), LockError> {
        #![allow(unused_variables)]
        let unused = 1;
        Ok(())
    }

    /// Documented and public.
    #[distributed_lock(name = "public", ttl = "5s")]
    #[must_use = "a locked call does nothing unless awaited"]
    pub async fn public() -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {
    drop(jobs::crate_only());
    drop(jobs::public());
}
