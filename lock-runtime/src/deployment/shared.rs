//! A shared hold of a read-write lock: one attempt, and leaving the shared holders after an
//! attempt whose outcome is not known. Only on one logical server (see `Deployment::one_server`).

use std::sync::Arc;

use super::failure::Failure;
use super::{Acquired, Ask, Deployment, Held};
use crate::LockError;
use crate::model::keys::Keys;
use crate::plumbing::fanout::Fanout;
use crate::server::{AcquireReply, Node};

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
        let failure = match node.acquire_shared(keys, &request, ask.hold_ms).await {
            Ok((AcquireReply::Taken { fence }, value)) => {
                return Ok(Acquired::Granted {
                    fence,
                    record_fence: false,
                    nodes: vec![0],
                    late: Fanout::none(),
                    held: Held::Shared(value.unwrap_or_default()),
                });
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
