//! A shared hold of a read-write lock: one attempt, and leaving the shared holders after an
//! attempt whose outcome is not known. Only on one logical server (see `Deployment::one_server`).

use std::sync::Arc;

use super::failure::{Failure, other_mode};
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
        let failure = match node.acquire_shared(keys, &request).await {
            Ok((AcquireReply::Taken { fence }, Some(place))) => {
                return Ok(Acquired::Granted {
                    fence,
                    record_fence: false,
                    nodes: vec![0],
                    late: Fanout::none(),
                    held: Held::Shared(place),
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
