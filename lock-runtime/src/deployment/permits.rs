//! A lock with `permits = N`: one attempt, and freeing what a dropped attempt took. Only on one
//! logical server: on Redlock's independent servers, each could grant a different permit.

use std::sync::Arc;

use redis::RedisResult;

use super::failure::{Failure, other_mode};
use super::mode::Mode;
use super::{Acquired, Ask, Deployment};
use crate::LockError;
use crate::model::hold::{Held, HoldKind};
use crate::model::keys::Keys;
use crate::plumbing::fanout::Fanout;
use crate::server::{Node, PermitReply, Release};
use crate::state::lease_state::LeaseState;

/// The [`Mode`] of a hold of one of a lock's N permits (the number is N).
pub(super) struct Permits(pub u32);

impl Mode for Permits {
    async fn attempt(
        &self,
        deployment: &Deployment,
        name: &str,
        keys: &Keys,
        ask: &Ask<'_>,
    ) -> Result<Acquired, LockError> {
        let node = deployment.one_server(name, ask.kind)?;
        // Boxed: the exclusive attempt's future, beside which this one sits, stays small.
        Box::pin(deployment.acquire_permit(node, name, keys, ask, self.0)).await
    }

    fn forget(&self, deployment: &Deployment, keys: &Keys, token: &str) {
        deployment.forget_permit(keys, token, self.0);
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

impl Deployment {
    /// The one server a hold of `kind` (permits, or shared) lives on: refused on Redlock's
    /// independent servers, where each could grant a different permit, or let a shared holder
    /// and an exclusive one in on different majorities' counts.
    pub(super) fn one_server(&self, name: &str, kind: HoldKind) -> Result<&Arc<Node>, LockError> {
        self.alone().filter(|_| self.traits.fair_queue).ok_or_else(|| {
            let (option, why, instead) = match kind {
                HoldKind::Permits(n) => (
                    format!("permits = {n}"),
                    "each could grant a different permit, so more than N could hold",
                    "use permits = 1 there",
                ),
                _ => (
                    "shared".to_owned(),
                    "shared and exclusive holders would be counted by different servers",
                    "use exclusive holds there",
                ),
            };
            LockError::config(
                name,
                format!(
                    "{option} needs one logical server (one server, Redis Cluster or Sentinel): \
                     on Redlock's independent servers {why}; {instead}"
                ),
            )
        })
    }

    /// One attempt on `node` for a lock with `ask.permits` permits (see
    /// `Node::acquire_permit`), bounded as an attempt on one server is.
    pub(super) async fn acquire_permit(
        &self,
        node: &Node,
        name: &str,
        keys: &Keys,
        ask: &Ask<'_>,
        permits: u32,
    ) -> Result<Acquired, LockError> {
        let request = self.one_server_request(ask);
        let reply = node.acquire_permit(keys, permits, &request).await;
        let failure = match reply {
            Ok(PermitReply::Taken { fence, permit }) => {
                return Ok(Acquired::Granted {
                    fence,
                    plain: false,
                    nodes: vec![0],
                    late: Fanout::none(),
                    held: Held::Permit {
                        index: permit,
                        of: permits,
                    },
                });
            }
            Ok(PermitReply::Busy { pttl }) => {
                return Ok(Acquired::Busy {
                    pttl,
                    nodes: vec![0],
                });
            }
            Ok(PermitReply::NotOurTurn { head, state }) => {
                return Ok(Acquired::NotOurTurn { head, state });
            }
            Ok(PermitReply::OtherMode { held }) => {
                return Err(other_mode(name, &keys.key, ask.kind, &held));
            }
            Ok(PermitReply::Foreign { key, detail }) => Failure::Foreign { key, detail },
            Ok(PermitReply::NotReplicated { acked }) => Failure::NotReplicated {
                acked,
                needed: node.replicas(),
            },
            Err(e) => {
                // The request may have gone through.
                self.forget_permit(keys, ask.token, permits);
                Failure::Redis(e)
            }
        };
        Err(self.unavailable(name, 0, vec![(0, failure)]))
    }

    /// An operator's compare-and-delete of `value` on the permit of the lock `keys` that holds
    /// it, its waiters told; false when the name keeps no count of permits or no permit holds
    /// `value` (nothing touched). One logical server only, where permits are.
    pub(crate) async fn force_release_permit(
        &self,
        name: &str,
        keys: &Keys,
        value: &str,
    ) -> Result<bool, LockError> {
        let Some(node) = self.alone() else {
            return Ok(false);
        };
        let count = node.permit_count(keys).await;
        let Some(permits) = count.map_err(|e| node.redis_error(name, e))? else {
            return Ok(false);
        };
        node.forget_permit(keys, permits, value)
            .await
            .map_err(|e| node.redis_error(name, e))
    }

    /// Frees, in the background, the permit that `token` may hold (an attempt whose outcome is
    /// not known).
    pub(super) fn forget_permit(&self, keys: &Keys, token: &str, permits: u32) {
        let (node, keys, token) = (Arc::clone(&self.nodes[0]), keys.clone(), token.to_owned());
        tokio::spawn(async move {
            if let Err(e) = node.forget_permit(&keys, permits, &token).await {
                tracing::debug!(target: "lock_runtime::acquire", node = node.addr(), key = %keys.key, error = %e, "freeing a permit after a dropped attempt failed; it expires by its ttl");
            }
        });
    }
}
