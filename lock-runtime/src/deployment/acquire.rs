//! One acquire attempt on every server at once, decided by the majority; undoing a failed one.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;

use super::failure::{Failure, other_mode};
use super::majority::Tally;
use super::mode::{Mode, with_mode};
use super::release::release_quietly;
use super::replies::AcquireReplies;
use super::{Acquired, Ask, Deployment, Late};
use crate::LockError;
use crate::model::hold::Held;
use crate::model::hold::HoldKind;
use crate::model::keys::Keys;
use crate::plumbing::fanout::Fanout;
use crate::server::{AcquireReply, AcquireRequest, FastReply};
use crate::state::lease_state::LeaseState;

impl Deployment {
    /// One acquire attempt on every server at once. Decided as soon as a majority granted it or
    /// is out of reach; a failed attempt deletes what it took (at once where granted, and on
    /// servers whose reply is still out as soon as they answer). The caller bounds the whole call
    /// by [`Self::attempt_bound`]: on one server, the plain-command request has no other bound.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        keys: &Keys,
        ask: &Ask<'_>,
    ) -> Result<Acquired, LockError> {
        with_mode!(ask.kind, |mode| mode.attempt(self, name, keys, ask).await)
    }

    /// One attempt at the lock's own key (see [`Self::acquire`]): plain commands when one server
    /// decides alone and nobody queues, the acquire script otherwise.
    pub(super) async fn acquire_key(
        &self,
        name: &str,
        keys: &Keys,
        ask: &Ask<'_>,
    ) -> Result<Acquired, LockError> {
        let limit = self.per_node_limit(ask.validity);
        // One server, nobody queued on our behalf: plain commands, no script. Not on a Redis
        // Cluster: there a pipeline that meets a slot in migration is sent again whole to the
        // importing node, so its SET could land on both; the script is one atomic command.
        if let Some(node) = self.alone()
            && self.traits.plain_commands
            && ask.waiter.is_none()
            && ask.evict.is_none()
        {
            match node
                .acquire_fast(keys, ask.token, ask.ttl_ms, ask.fenced, ask.sent)
                .await
            {
                Ok(FastReply::Taken { fence }) => {
                    return Ok(Acquired::Granted {
                        fence,
                        // Without a fence there is nothing to record (a nested call that needs
                        // one writes the counter when it computes it): the release sends 0.
                        plain: true,
                        nodes: vec![0],
                        late: Fanout::none(),
                        held: Held::Key,
                    });
                }
                Ok(FastReply::OtherMode { held }) => {
                    return Err(other_mode(name, &keys.key, ask.kind, &held));
                }
                Ok(FastReply::Busy) => {
                    // Held: a waiter subscribes and asks the script next, which knows the PTTL.
                    return Ok(Acquired::Busy {
                        pttl: None,
                        nodes: vec![0],
                    });
                }
                Ok(FastReply::NotReplicated { acked }) => {
                    // The node deleted the unacknowledged key already.
                    let failure = Failure::NotReplicated {
                        acked,
                        needed: node.replicas(),
                    };
                    return Err(self.unavailable(name, 0, vec![(0, failure)]));
                }
                Ok(FastReply::Unclear { taken }) => {
                    // The script tells what the key or the counter holds. A SET that went
                    // through is undone first, the whole way through the release script (with
                    // waiters queued, it hands the lock to the first of them).
                    if taken {
                        let how = self.cleanup(0);
                        let _ = Box::pin(node.release(keys, ask.token, &how)).await;
                    }
                }
                Err(e) => {
                    Box::pin(self.abandon(keys, ask.token, &[], vec![0], Fanout::none(), limit))
                        .await;
                    return Err(self.unavailable(name, 0, vec![(0, Failure::Redis(e))]));
                }
            }
        }
        // Boxed: the uncontended call's future stays small (it is moved at every layer above).
        Box::pin(self.acquire_by_script(name, keys, ask, limit)).await
    }

    /// The acquire script on every server at once (one server: awaited in place), decided by
    /// the majority: granted (with the counters behind raised), not our turn, busy, or failed
    /// (what was taken is undone first).
    async fn acquire_by_script(
        &self,
        name: &str,
        keys: &Keys,
        ask: &Ask<'_>,
        limit: Duration,
    ) -> Result<Acquired, LockError> {
        let (majority, n) = (self.majority, self.nodes.len());
        let (replies, fanout) = self.send_acquire(keys, ask, limit).await;
        let mut r = AcquireReplies::of(replies, |i| self.nodes[i].replicas());
        let granted = r.granted_servers();
        if majority.reached(granted.len()) {
            let (fence, behind) = r.fence_and_behind();
            let retention = self.fence_retention_ms;
            let raise_failures = self
                .raise_fences(&behind, keys, fence, retention, limit)
                .await;
            if majority.reached(granted.len() - raise_failures.len()) {
                return Ok(Acquired::Granted {
                    fence,
                    plain: false,
                    nodes: granted,
                    late: fanout,
                    held: Held::Key,
                });
            }
            r.failures.extend(raise_failures.into_iter().map(|(i, e)| {
                let why = format!("granted, but raising the fence counter failed: {e}");
                (i, Failure::Other(why))
            }));
        }
        self.abandon(keys, ask.token, &granted, r.unsure, fanout, limit)
            .await;
        if let Some((head, state)) = r.not_our_turn {
            return Ok(Acquired::NotOurTurn { head, state });
        }
        if let Some(held) = r.other_mode {
            return Err(other_mode(name, &keys.key, ask.kind, &held));
        }
        if majority.reached(n - r.failures.len())
            && let Some(pttl) = r.busy_pttl
        {
            return Ok(Acquired::Busy {
                pttl,
                nodes: r.busy,
            });
        }
        Err(self.unavailable(name, granted.len(), r.failures))
    }

    /// Sends the acquire script to every server; returns the replies once the majority rule
    /// settles the attempt (one server: its reply, awaited in place, nothing boxed or cloned),
    /// and the requests still out.
    async fn send_acquire(
        &self,
        keys: &Keys,
        ask: &Ask<'_>,
        limit: Duration,
    ) -> (Vec<Option<RedisResult<AcquireReply>>>, Late) {
        let (quantum, retention) = (self.traits.fence_quantum_us, self.fence_retention_ms);
        if let Some(node) = self.alone() {
            let request = AcquireRequest {
                token: ask.token,
                ttl_ms: ask.ttl_ms,
                waiter: ask.waiter,
                evict: ask.evict,
                fence_quantum: quantum,
                fence_retention_ms: retention,
                limit,
                queue: true,
            };
            let reply = node.acquire(keys, &request).await;
            return (vec![Some(reply)], Fanout::none());
        }
        // Nobody can read the fence and nobody queues: plain commands, as on one server.
        let unfenced = !ask.fenced && ask.waiter.is_none() && ask.evict.is_none();
        let mut fanout: Late = Fanout::new(self.nodes.iter().map(|node| {
            let node = Arc::clone(node);
            let keys = keys.clone();
            let (token, ttl_ms) = (ask.token.to_owned(), ask.ttl_ms);
            let waiter = ask.waiter.cloned();
            let evict = ask.evict.map(|(h, s)| (h.to_owned(), s.to_owned()));
            async move {
                let request = AcquireRequest {
                    token: &token,
                    ttl_ms,
                    waiter: waiter.as_ref(),
                    evict: evict.as_ref().map(|(h, s)| (h.as_str(), s.as_str())),
                    fence_quantum: quantum,
                    fence_retention_ms: retention,
                    limit,
                    queue: false,
                };
                match unfenced {
                    true => node.acquire_unfenced(&keys, &request).await,
                    false => node.acquire(&keys, &request).await,
                }
            }
        }));
        let majority = self.majority;
        fanout
            .until(|replies| {
                let granted = replies
                    .iter()
                    .filter(|r| matches!(r, Some(Ok(AcquireReply::Taken { .. }))))
                    .count();
                let answered = replies.iter().filter(|r| r.is_some()).count();
                majority.settled(Tally {
                    yes: granted,
                    no: 0,
                    failed: answered - granted,
                })
            })
            .await;
        (fanout.take_replies(), fanout)
    }

    /// Raises the fence counter of the `behind` servers to `fence`, so that the next majority,
    /// which meets this one on at least one server, counts past it. Returns where it failed.
    pub(super) async fn raise_fences(
        &self,
        behind: &[usize],
        keys: &Keys,
        fence: u64,
        retention_ms: u64,
        limit: Duration,
    ) -> Vec<(usize, redis::RedisError)> {
        if behind.is_empty() {
            return Vec::new();
        }
        let results = Fanout::new(behind.iter().map(|&i| {
            let (node, keys) = (Arc::clone(&self.nodes[i]), keys.clone());
            async move { node.raise_fence(&keys, fence, retention_ms, limit).await }
        }))
        .all()
        .await;
        behind
            .iter()
            .zip(results)
            .filter_map(|(&i, r)| r.err().map(|e| (i, e)))
            .collect()
    }

    /// Undoes an attempt with compare-and-delete of `token` (a key that is not ours is left
    /// alone): on the servers that granted it at once, waiting up to `limit` for them; in the
    /// background on the servers whose request failed (it may still have been applied) and on
    /// each server whose reply is still out, as soon as it comes. The caller never waits longer than `limit`
    /// on a server that may not answer.
    pub(crate) async fn abandon(
        &self,
        keys: &Keys,
        token: &str,
        granted: &[usize],
        unsure: Vec<usize>,
        mut late: Late,
        limit: Duration,
    ) {
        let how = Arc::new(self.cleanup(0));
        let release = {
            let (nodes, keys, token) = (self.nodes.clone(), keys.clone(), token.to_owned());
            move |i: usize| {
                let (node, keys, token) = (Arc::clone(&nodes[i]), keys.clone(), token.clone());
                let how = Arc::clone(&how);
                async move { release_quietly(&node, &keys, &token, &how).await }
            }
        };
        if late.has_late() || !unsure.is_empty() {
            let release = release.clone();
            tokio::spawn(async move {
                crate::plumbing::fanout::join_all(unsure.into_iter().map(&release).collect()).await;
                while let Some((i, reply)) = late.next_late().await {
                    if matches!(reply, Ok(AcquireReply::Taken { .. }) | Err(_)) {
                        release(i).await;
                    }
                }
            });
        }
        let mut cleanups = Fanout::new(granted.iter().map(|&i| release(i)));
        let _ = tokio::time::timeout(limit, cleanups.until(|_| false)).await;
        cleanups.detach();
    }

    /// Compare-and-delete of `token` on every server at once, without waiting for a reply (an
    /// acquire dropped mid-request). Sent behind that request on each connection, it reaches
    /// the server after it.
    pub(crate) fn forget(&self, keys: &Keys, token: &str, kind: HoldKind) {
        with_mode!(kind, |mode| mode.forget(self, keys, token));
    }

    /// [`Self::forget`] of the lock's own key.
    pub(super) fn forget_key(&self, keys: &Keys, token: &str) {
        for node in &self.nodes {
            let how = self.cleanup(0);
            let (node, keys, token) = (Arc::clone(node), keys.clone(), token.to_owned());
            tokio::spawn(async move { release_quietly(&node, &keys, &token, &how).await });
        }
    }

    /// Follows the requests of a granted attempt that were still out. A late grant is part of
    /// the lease; but if the lease already ended, its release may have reached that server
    /// before our SET did, so the key is released again there.
    pub(crate) async fn settle_late_grants(&self, lease: Arc<LeaseState>, mut late: Late) {
        let keys = lease.keys.clone();
        while let Some((i, reply)) = late.next_late().await {
            if matches!(reply, Ok(AcquireReply::Taken { .. }) | Err(_)) && lease.is_ended() {
                release_quietly(
                    &self.nodes[i],
                    &keys,
                    &lease.token,
                    &self.cleanup(lease.keep_ms()),
                )
                .await;
            }
        }
    }
}
