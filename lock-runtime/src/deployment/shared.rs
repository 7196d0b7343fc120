//! A shared hold of a read-write lock: one attempt, and leaving the shared holders after an
//! attempt whose outcome is not known. Only on one logical server (see `Deployment::one_server`).

use std::sync::Arc;

use redis::RedisResult;

use super::failure::{Failure, other_mode};
use super::mode::Mode;
use super::{Acquired, Ask, Deployment};
use crate::LockError;
use crate::model::hold::Held;
use crate::model::keys::Keys;
use crate::plumbing::fanout::Fanout;
use crate::server::{AcquireReply, Node, Release};
use crate::state::lease_state::LeaseState;

/// The [`Mode`] of a shared hold of a read-write lock.
pub(super) struct Shared;

impl Mode for Shared {
    async fn attempt(
        &self,
        deployment: &Deployment,
        name: &str,
        keys: &Keys,
        ask: &Ask<'_>,
    ) -> Result<Acquired, LockError> {
        let node = deployment.one_server(name, ask.kind)?;
        // Boxed: the exclusive attempt's future, beside which this one sits, stays small.
        Box::pin(deployment.acquire_shared(node, name, keys, ask)).await
    }

    fn forget(&self, deployment: &Deployment, keys: &Keys, token: &str) {
        deployment.forget_shared(keys, token);
    }

    /// Leaves the shared holders under the holder's own place; the last one out releases the
    /// lock's key (see `Node::release_shared`).
    async fn release_on(
        &self,
        node: &Node,
        lease: &LeaseState,
        how: &Release,
    ) -> RedisResult<bool> {
        let Held::Shared { member, .. } = &lease.held else {
            unreachable!("a shared mode releases shared holds")
        };
        node.release_shared(&lease.keys, &lease.token, member, how)
            .await
    }
}

impl Deployment {
    /// One shared attempt on `node` (see `Node::acquire_shared`), bounded as an attempt on one
    /// server is; it queues in arrival order with the exclusive waiters.
    pub(super) async fn acquire_shared(
        &self,
        node: &Node,
        name: &str,
        keys: &Keys,
        ask: &Ask<'_>,
    ) -> Result<Acquired, LockError> {
        let request = self.one_server_request(ask);
        let failure = match node.acquire_shared(keys, &request).await {
            Ok((AcquireReply::Taken { fence }, Some(place))) => {
                return Ok(Acquired::Granted {
                    fence,
                    plain: false,
                    nodes: vec![0],
                    late: Fanout::none(),
                    held: Held::Shared {
                        value: place.value,
                        member: place.member,
                    },
                });
            }
            Ok((AcquireReply::Taken { .. }, None)) => {
                // A reply without the place: the script and this code disagree.
                self.forget_shared(keys, ask.token);
                Failure::Other("the shared acquire's reply lacks the holder's place".to_owned())
            }
            Ok((AcquireReply::OtherMode { held }, _)) => {
                return Err(other_mode(name, &keys.key, ask.kind, &held));
            }
            Ok((AcquireReply::Busy { pttl }, _)) => {
                return Ok(Acquired::Busy {
                    pttl,
                    nodes: vec![0],
                });
            }
            Ok((AcquireReply::NotOurTurn { head, state }, _)) => {
                return Ok(Acquired::NotOurTurn { head, state });
            }
            Ok((AcquireReply::Foreign { key, detail }, _)) => Failure::Foreign { key, detail },
            Ok((AcquireReply::NotReplicated { acked }, _)) => Failure::NotReplicated {
                acked,
                needed: node.replicas(),
            },
            Err(e) => {
                // The request may have gone through.
                self.forget_shared(keys, ask.token);
                Failure::Redis(e)
            }
        };
        Err(self.unavailable(name, 0, vec![(0, failure)]))
    }

    /// An operator's release of one shared holder, by its value (see `Holding::value`): it leaves
    /// the shared holders (the others keep the lock; the last one out releases the key). False
    /// when no live shared holder has that value (nothing touched). One logical server only,
    /// where shared holds are.
    pub(crate) async fn force_release_shared(
        &self,
        name: &str,
        keys: &Keys,
        value: &str,
    ) -> Result<bool, LockError> {
        let Some(node) = self.alone() else {
            return Ok(false);
        };
        node.release_shared(keys, "", value, &self.cleanup(0))
            .await
            .map_err(|e| node.redis_error(name, e))
    }

    /// Takes `token` out of the shared holders, in the background, if an attempt whose outcome
    /// is not known put it there.
    pub(super) fn forget_shared(&self, keys: &Keys, token: &str) {
        let (node, keys, token) = (Arc::clone(&self.nodes[0]), keys.clone(), token.to_owned());
        let how = self.cleanup(0);
        tokio::spawn(async move {
            if let Err(e) = node.release_shared(&keys, "", &token, &how).await {
                tracing::debug!(target: "lock_runtime::acquire", node = node.addr(), key = %keys.key, error = %e, "leaving the shared holders after a dropped attempt failed; the hold expires by its lease");
            }
        });
    }
}
