//! What a deployment does differently for each kind of hold (see `model::hold`): one
//! implementation of [`Mode`] per kind, in the kind's own file (`exclusive.rs`, `permits.rs`,
//! `shared.rs`), and [`with_mode!`], the one place that picks the implementation for a kind.
//! A new kind of hold is a variant of `HoldKind` and `Held`, its scripts in `server/`, and one
//! more implementation here.

use redis::RedisResult;

use super::{Acquired, Ask, Deployment};
use crate::LockError;
use crate::model::keys::Keys;
use crate::server::{Node, Release};
use crate::state::lease_state::LeaseState;

/// The steps of a hold that differ by its kind.
pub(super) trait Mode {
    /// One acquire attempt (see `Deployment::acquire`).
    async fn attempt(
        &self,
        deployment: &Deployment,
        name: &str,
        keys: &Keys,
        ask: &Ask<'_>,
    ) -> Result<Acquired, LockError>;

    /// Frees, in the background, what an attempt under `token` whose outcome is not known may
    /// hold (see `Deployment::forget`).
    fn forget(&self, deployment: &Deployment, keys: &Keys, token: &str);

    /// Releases the granted `lease` on one server (or keeps its key for `how.keep_ms`); true
    /// when it was still held there.
    async fn release_on(&self, node: &Node, lease: &LeaseState, how: &Release)
    -> RedisResult<bool>;
}

/// Evaluates `$body` with `$mode` bound to the [`Mode`] of the hold kind `$kind`.
macro_rules! with_mode {
    ($kind:expr, |$mode:ident| $body:expr) => {
        match $kind {
            $crate::model::hold::HoldKind::Exclusive => {
                let $mode = &super::exclusive::Exclusive;
                $body
            }
            $crate::model::hold::HoldKind::Permits(n) => {
                let $mode = &super::permits::Permits(n);
                $body
            }
            $crate::model::hold::HoldKind::Shared => {
                let $mode = &super::shared::Shared;
                $body
            }
        }
    };
}
pub(super) use with_mode;
