//! Releasing a lease on every server at once, and computing a late fence.

use std::sync::Arc;

use redis::RedisResult;

use super::Deployment;
use super::failure::Failure;
use super::majority::{Tally, Verdict};
use super::mode::{Mode, with_mode};
use super::replies::fence_and_behind;
use crate::model::keys::Keys;
use crate::plumbing::fanout::Fanout;
use crate::server::{FenceReply, Node, Release};
use crate::state::lease_state::LeaseState;
use crate::{LockError, LostReason};

impl Deployment {
    /// The fence of a lease taken without one (see `LockOptions::without_fence`),
    /// computed now for a nested call that can read it, while the key still holds the lease's
    /// token. `Lost` when it no longer does.
    pub(crate) async fn fence_for(&self, lease: &LeaseState) -> Result<u64, LockError> {
        // Only the plain-command paths (one server, Redlock) take a lease without its fence.
        let fence = lease.fence();
        if fence != 0 {
            return Ok(fence);
        }
        let Some(node) = self.alone() else {
            return Box::pin(self.fence_on_majority(lease)).await;
        };
        let keys = &lease.keys;
        let limit = node.response_timeout();
        match node
            .fence_held(keys, &lease.token, self.fence_retention_ms, limit)
            .await
        {
            Ok(FenceReply::Fence(fence)) => Ok(lease.set_fence(fence)),
            Ok(FenceReply::NotOurs) => {
                lease.mark_lost(LostReason::NotOwner);
                Err(lease.lost_error(LostReason::NotOwner))
            }
            Ok(FenceReply::Unusable(why)) => Err(LockError::NotALock {
                name: lease.name.clone(),
                key: keys.fence().to_string(),
                detail: why,
            }),
            Err(e) => Err(node.redis_error(&lease.name, e)),
        }
    }

    /// [`Self::fence_for`] on several servers (Redlock): each server that still holds the key
    /// computes its own fence, and the highest is raised on the others, so that a majority's
    /// counters hold it before it is handed out (as an acquire does).
    async fn fence_on_majority(&self, lease: &LeaseState) -> Result<u64, LockError> {
        let (keys, retention) = (&lease.keys, self.fence_retention_ms);
        let limit = self.nodes[0].response_timeout();
        let replies = Fanout::new(self.nodes.iter().map(|node| {
            let (node, keys, token) = (Arc::clone(node), keys.clone(), lease.token.clone());
            async move { node.fence_held(&keys, &token, retention, limit).await }
        }))
        .all()
        .await;
        let (mut fenced, mut failures, mut not_ours) = (Vec::new(), Vec::new(), 0);
        for (i, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(FenceReply::Fence(fence)) => fenced.push((i, fence)),
                Ok(FenceReply::NotOurs) => not_ours += 1,
                Ok(FenceReply::Unusable(detail)) => {
                    let key = keys.fence().to_string();
                    failures.push((i, Failure::Foreign { key, detail }));
                }
                Err(e) => failures.push((i, Failure::Redis(e))),
            }
        }
        let (fence, behind) = fence_and_behind(&fenced);
        let raise_failures = self
            .raise_fences(&behind, keys, fence, retention, limit)
            .await;
        let yes = fenced.len() - raise_failures.len();
        failures.extend(
            raise_failures
                .into_iter()
                .map(|(i, e)| (i, Failure::Redis(e))),
        );
        let tally = Tally {
            yes,
            no: not_ours,
            failed: failures.len(),
        };
        match self.majority.verdict(tally) {
            Verdict::Yes => Ok(lease.set_fence(fence)),
            Verdict::No => {
                lease.mark_lost(LostReason::NotOwner);
                Err(lease.lost_error(LostReason::NotOwner))
            }
            Verdict::OutOfReach | Verdict::Open => {
                Err(self.unavailable(&lease.name, yes, failures))
            }
        }
    }

    /// Compare-and-delete (or keep for the rest of `min_hold`) on every server at once; held
    /// when a majority confirms. `Lost` when the key was no longer ours.
    pub(crate) async fn release(&self, lease: &LeaseState) -> Result<(), LockError> {
        let how = Release {
            keep_ms: lease.keep_ms(),
            always_publish: self.traits.always_publish,
            record_fence: if lease.is_plain() { lease.fence() } else { 0 },
            fence_retention_ms: self.fence_retention_ms,
            // No waiter marks a permit's value: its release looks at the queue all the same.
            look_at_queue: lease.is_permit(),
            short_first: lease.is_plain(),
        };
        // One server decides alone: no shared request, no tally (nothing allocated).
        if let Some(node) = self.alone() {
            let released = with_mode!(lease.held.kind(), |mode| {
                again_if_dropped(|| mode.release_on(node, lease, &how)).await
            });
            return match released {
                Ok(true) => Ok(()),
                Ok(false) => Err(lease.lost_error(LostReason::GoneAtRelease)),
                Err(e) => Err(self.unavailable(&lease.name, 0, vec![(0, Failure::Redis(e))])),
            };
        }
        let keys = &lease.keys;
        let (t, failures) = self.release_everywhere(keys, &lease.token, how).await;
        match self.majority.verdict(t) {
            Verdict::Yes => Ok(()),
            Verdict::No => Err(lease.lost_error(LostReason::GoneAtRelease)),
            Verdict::OutOfReach | Verdict::Open => {
                Err(self.unavailable(&lease.name, t.yes, failures))
            }
        }
    }

    /// An operator's compare-and-delete of `value` on every server at once, its waiters woken;
    /// true when a majority deleted it, false when the value was not there (nothing touched).
    pub(crate) async fn force_release(
        &self,
        name: &str,
        keys: &Keys,
        value: &str,
    ) -> Result<bool, LockError> {
        let how = Release {
            keep_ms: 0,
            always_publish: self.traits.always_publish,
            record_fence: 0,
            fence_retention_ms: self.fence_retention_ms,
            // The value seen may carry the waiters' mark: the waiters are served either way.
            look_at_queue: true,
            short_first: false,
        };
        let (t, failures) = self.release_everywhere(keys, value, how).await;
        match self.majority.verdict(t) {
            Verdict::Yes => Ok(true),
            Verdict::No => Ok(false),
            Verdict::OutOfReach | Verdict::Open => Err(self.unavailable(name, t.yes, failures)),
        }
    }

    /// Releases `token` on every server at once, as [`release_on`] does on one; returns the
    /// tally once the majority rule settles it, and the servers that failed.
    async fn release_everywhere(
        &self,
        keys: &Keys,
        token: &str,
        how: Release,
    ) -> (Tally, Vec<(usize, Failure)>) {
        let how = Arc::new(how);
        let majority = self.majority;
        let mut fanout = Fanout::new(self.nodes.iter().map(|node| {
            let node = Arc::clone(node);
            let (keys, token, how) = (keys.clone(), token.to_owned(), Arc::clone(&how));
            async move { again_if_dropped(|| node.release(&keys, &token, &how)).await }
        }));
        fanout
            .until(|replies| majority.settled(Tally::of(replies.iter().map(answer))))
            .await;
        let replies = fanout.take_replies();
        fanout.detach();
        let t = Tally::of(replies.iter().map(answer));
        let failures = replies
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Err(e)) => Some((i, Failure::Redis(e))),
                _ => None,
            })
            .collect();
        (t, failures)
    }
}

/// A release on one server (see `Mode::release_on`), sent once more when its connection was
/// found gone (its runtime shut down, or the server restarted: redis-rs is making it again), as
/// compare-and-delete twice is harmless. If the second finds the key not ours, the first may have
/// run after all: the connection failure is the honest answer, not a lost lease.
async fn again_if_dropped<F, R>(release: F) -> RedisResult<bool>
where
    F: Fn() -> R,
    R: Future<Output = RedisResult<bool>>,
{
    let out = release().await;
    match &out {
        Err(dropped) if dropped.is_connection_dropped() => match release().await {
            Ok(false) => out,
            again => again,
        },
        _ => out,
    }
}

/// One server's yes/no reply, `Some(None)` when its request failed, `None` when still out.
fn answer(reply: &Option<RedisResult<bool>>) -> Option<Option<bool>> {
    reply.as_ref().map(|r| r.as_ref().ok().copied())
}

/// Compare-and-delete (or shorten to `keep_ms`) `token` on one server; a failure is logged and
/// left to the key's ttl.
pub(super) async fn release_quietly(node: &Node, keys: &Keys, token: &str, how: &Release) {
    if let Err(e) = node.release(keys, token, how).await {
        tracing::debug!(target: "lock_runtime::release", node = node.addr(), key = %keys.key, error = %e, "cleanup release failed; the key expires by its ttl");
    }
}
