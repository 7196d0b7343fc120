//! An exclusive hold: the lock's own key, on every server at once, decided by the majority (see
//! `acquire.rs` for the attempt and its undo, `release.rs` for the release).

use redis::RedisResult;

use super::mode::Mode;
use super::{Acquired, Ask, Deployment};
use crate::LockError;
use crate::model::keys::Keys;
use crate::server::{Node, Release};
use crate::state::lease_state::LeaseState;

/// The [`Mode`] of an exclusive hold.
pub(super) struct Exclusive;

impl Mode for Exclusive {
    async fn attempt(
        &self,
        deployment: &Deployment,
        name: &str,
        keys: &Keys,
        ask: &Ask<'_>,
    ) -> Result<Acquired, LockError> {
        deployment.acquire_key(name, keys, ask).await
    }

    fn forget(&self, deployment: &Deployment, keys: &Keys, token: &str) {
        deployment.forget_key(keys, token);
    }

    async fn release_on(
        &self,
        node: &Node,
        lease: &LeaseState,
        how: &Release,
    ) -> RedisResult<bool> {
        node.release(&lease.keys, &lease.token, how).await
    }
}
