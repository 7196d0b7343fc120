//! A deployment: the servers a lock lives on, and the one place that decides each set of replies.
//!
//! One server is simply N = 1. Redlock is N independent servers: a lock holds with a majority
//! `N/2 + 1` of the configured N (not of the reachable ones). Every request goes to all servers
//! at once and is decided as soon as the replies so far decide it, so that one slow or silent
//! server never holds up a decision the others already made.

mod majority;
mod replies;

use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;
use tokio::time::Instant;

use crate::model::keys::{KeyFormat, Keys};
use crate::plumbing::deadlines::Deadlines;
use crate::plumbing::fanout::Fanout;
use crate::server::pubsub::Subscription;
use crate::server::{
    AcquireReply, AcquireRequest, FastReply, FenceReply, Node, Release, RenewReply, Waiter,
};
use crate::state::lease_state::LeaseState;
use crate::{LockError, LostReason};
use majority::{Majority, Tally, Verdict};
use replies::AcquireReplies;

/// Fence floor granularity on a Redlock node: the server's clock rounded down to the second, so
/// that the nodes of a majority hand out the same fence and need no second round trip to agree.
const REDLOCK_FENCE_QUANTUM_US: u64 = 1_000_000;

/// The servers of one locker and the majority it needs.
pub(crate) struct Quorum {
    nodes: Vec<Arc<Node>>,
    majority: Majority,
    /// How long an unused fence counter is kept; 0 forever.
    fence_retention_ms: u64,
    /// How lock names become keys (and so where the derived keys live).
    key_format: KeyFormat,
}

/// Acquire requests still out when an attempt was decided.
pub(crate) type Late = Fanout<RedisResult<AcquireReply>>;

/// What one acquire attempt asks besides the keys.
pub(crate) struct Ask<'a> {
    /// When the attempt began (just before its request is sent).
    pub sent: Instant,
    pub token: &'a str,
    pub ttl_ms: u64,
    /// The validity window: a reply later than this is useless.
    pub validity: Duration,
    pub waiter: Option<&'a Waiter>,
    pub evict: Option<(&'a str, &'a str)>,
    /// The caller can read the fence (see `LockOptions::without_fence`).
    pub fenced: bool,
}

/// The decided outcome of one acquire attempt.
pub(crate) enum Acquired {
    /// A majority granted it: the fence, the servers that granted it, and the requests still
    /// out (late grants are part of the lease: renewed and released with the rest).
    Granted {
        fence: u64,
        /// Taken by the plain-command path: the fence counter is written at release.
        record_fence: bool,
        nodes: Vec<usize>,
        late: Late,
    },
    /// Others hold it: the shortest remaining PTTL seen, and the servers that said busy (only
    /// their release messages can change the next attempt's outcome). What this attempt took on
    /// other servers was deleted.
    Busy {
        pttl: Option<Duration>,
        nodes: Vec<usize>,
    },
    /// Free, but another waiter is first in line (one server, fair queue).
    NotOurTurn { head: String, state: String },
}

/// What a majority said of one lease in a renewal round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    Renewed,
    NotOwner,
    /// Renewed, but not acknowledged by the replicas asked for (`replicas(n)`).
    NotReplicated,
    /// No majority either way (servers down or slow): try again while still valid.
    Undecided,
}

impl Quorum {
    pub(crate) fn new(
        nodes: Vec<Arc<Node>>,
        fence_retention_ms: u64,
        key_format: KeyFormat,
    ) -> Self {
        Self {
            majority: Majority::of(nodes.len()),
            nodes,
            fence_retention_ms,
            key_format,
        }
    }

    /// The Redis names of the lock whose key is `key`.
    pub(crate) fn keys(&self, key: String) -> Keys {
        Keys::new(key, self.key_format)
    }

    /// The locker's schedule of request bounds (its nodes share one).
    pub(crate) fn deadlines(&self) -> &Deadlines {
        self.nodes[0].deadlines()
    }

    /// A release that only undoes (or keeps for `keep_ms`): no fence to record.
    fn cleanup(&self, keep_ms: u64) -> Release {
        Release {
            keep_ms,
            always_publish: self.always_publish(),
            record_fence: 0,
            fence_retention_ms: self.fence_retention_ms,
            // An undo is rare; waiters queued meanwhile may not have marked the value.
            look_at_queue: true,
        }
    }

    /// How many servers must agree: `N/2 + 1`.
    pub(crate) fn needed(&self) -> usize {
        self.majority.needed()
    }

    pub(crate) fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// How many leases the watchdog hands to one [`Self::renew`] call: a Redis Cluster groups
    /// them by primary itself (one pipeline per primary per round), so it takes a whole round.
    pub(crate) fn renew_chunk(&self) -> usize {
        match self.nodes.as_slice() {
            [node] if node.is_cluster() => usize::MAX,
            _ => crate::server::RENEW_CHUNK,
        }
    }

    /// The server of the fair waiter queue: there is one only on a single logical server (the
    /// servers of a majority could disagree on who is first).
    pub(crate) fn queue_node(&self) -> Option<&Arc<Node>> {
        match self.nodes.as_slice() {
            [node] => Some(node),
            _ => None,
        }
    }

    /// The bound of one whole acquire attempt (see `acquire`), connecting included: on one
    /// server the per-node limit (a reply after the validity is of no use), which also bounds
    /// the request of the plain-command path (it has no timer of its own); on several, one
    /// response timeout for each of the grants, raising fences and cleaning up a failed attempt.
    pub(crate) fn attempt_bound(&self, validity: Duration) -> Duration {
        match self.nodes.len() {
            1 => self.per_node_limit(validity),
            _ => self.nodes[0].response_timeout() * 3,
        }
    }

    /// The most any one request may take: with one server, the whole validity window; with
    /// several, a tenth of it, so that slow servers cannot eat the lease.
    fn per_node_limit(&self, validity: Duration) -> Duration {
        let share = match self.nodes.len() {
            1 => validity,
            _ => (validity / 10).max(Duration::from_millis(2)),
        };
        self.nodes[0].response_timeout().min(share)
    }

    /// Waiters queue on one server, and a release wakes them only when they do; across several
    /// servers nobody queues, so every release is published.
    fn always_publish(&self) -> bool {
        self.nodes.len() > 1
    }

    /// Fences on one server follow its clock to the µs; on a majority of several, to the second
    /// (see the acquire script).
    fn fence_quantum(&self) -> u64 {
        if self.nodes.len() == 1 {
            1
        } else {
            REDLOCK_FENCE_QUANTUM_US
        }
    }

    /// A failure of the whole deployment: with one server, that server's own error; with
    /// several, which ones failed and why.
    fn unavailable(&self, name: &str, got: usize, failures: Vec<(usize, Failure)>) -> LockError {
        if let [(i, failure)] = failures.as_slice()
            && self.nodes.len() == 1
        {
            return match failure {
                Failure::Redis(e) => self.nodes[*i].redis_error(name, e.clone()),
                Failure::Foreign(detail) => LockError::config(
                    name,
                    format!("{detail}; use another lock name or key prefix"),
                ),
                Failure::Other(why) => LockError::config(name, why.clone()),
                Failure::NotReplicated { acked, needed } => LockError::NotReplicated {
                    name: name.to_owned(),
                    addr: self.nodes[*i].addr().to_owned(),
                    acked: *acked,
                    needed: *needed,
                },
            };
        }
        LockError::QuorumUnavailable {
            name: name.to_owned(),
            got,
            needed: self.majority.needed(),
            failures: failures
                .into_iter()
                .map(|(i, f)| (self.nodes[i].addr().to_owned(), f.to_string()))
                .collect(),
        }
    }

    /// Checks every server at once (it answers, it is the deployment it was configured as, it
    /// has the replicas asked for); fails unless a majority passes. With one server, its own
    /// error.
    pub(crate) async fn check(&self) -> Result<(), LockError> {
        let checks = Fanout::new(self.nodes.iter().map(|node| {
            let node = Arc::clone(node);
            async move { node.check().await }
        }))
        .all()
        .await;
        let mut failures: Vec<(usize, LockError)> = checks
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| r.err().map(|e| (i, e)))
            .collect();
        let got = self.nodes.len() - failures.len();
        if failures.is_empty() || (self.majority.reached(got) && self.nodes.len() > 1) {
            return Ok(());
        }
        if self.nodes.len() == 1 {
            return Err(failures.remove(0).1);
        }
        Err(LockError::QuorumUnavailable {
            name: String::new(),
            got,
            needed: self.majority.needed(),
            failures: failures
                .into_iter()
                .map(|(i, e)| (self.nodes[i].addr().to_owned(), e.to_string()))
                .collect(),
        })
    }

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
        let limit = self.per_node_limit(ask.validity);
        // One server, nobody queued on our behalf: plain commands, no script. Not on a Redis
        // Cluster: there a pipeline that meets a slot in migration is sent again whole to the
        // importing node, so its SET could land on both; the script is one atomic command.
        if let [node] = self.nodes.as_slice()
            && ask.waiter.is_none()
            && ask.evict.is_none()
            && !node.is_cluster()
        {
            match node
                .acquire_fast(keys, ask.token, ask.ttl_ms, ask.fenced, ask.sent)
                .await
            {
                Ok(FastReply::Taken { fence }) => {
                    return Ok(Acquired::Granted {
                        fence,
                        // No fence, nothing to record (a nested call that needs one writes the
                        // counter when it computes it).
                        record_fence: ask.fenced,
                        nodes: vec![0],
                        late: Fanout::none(),
                    });
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
                    record_fence: false,
                    nodes: granted,
                    late: fanout,
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
        let (quantum, retention) = (self.fence_quantum(), self.fence_retention_ms);
        if let [node] = self.nodes.as_slice() {
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
                node.acquire(&keys, &request).await
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
    async fn raise_fences(
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
    pub(crate) fn forget(&self, keys: &Keys, token: &str) {
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
        let keys = self.keys(lease.key.clone());
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

    /// Renews `chunk` (one script call per server), deciding each lease as soon as a majority
    /// confirmed or denied it; requests still out finish in the background.
    pub(crate) async fn renew(&self, chunk: &Arc<Vec<Arc<LeaseState>>>) -> Vec<Renewal> {
        let mut fanout = Fanout::new(self.nodes.iter().map(|node| {
            let (node, chunk) = (Arc::clone(node), Arc::clone(chunk));
            async move { renew_on(&node, &chunk).await }
        }));
        let majority = self.majority;
        let lease_reply = |replies: &[Option<Vec<Option<RenewReply>>>], i: usize| {
            Tally::of(replies.iter().map(|r| {
                r.as_ref()
                    .map(|r| r[i].map(|reply| reply == RenewReply::Renewed))
            }))
        };
        fanout
            .until(|replies| {
                (0..chunk.len()).all(|i| {
                    let t = lease_reply(replies, i);
                    chunk[i].is_ended() || majority.settled(t)
                })
            })
            .await;
        let verdicts = (0..chunk.len())
            .map(|i| {
                let t = lease_reply(fanout.replies(), i);
                let unreplicated = fanout.replies().iter().any(|r| {
                    r.as_ref()
                        .is_some_and(|r| r[i] == Some(RenewReply::NotReplicated))
                });
                match majority.verdict(t) {
                    Verdict::Yes => Renewal::Renewed,
                    Verdict::No if unreplicated => Renewal::NotReplicated,
                    Verdict::No => Renewal::NotOwner,
                    Verdict::OutOfReach | Verdict::Open => Renewal::Undecided,
                }
            })
            .collect();
        fanout.detach();
        verdicts
    }

    /// The fence of a lease taken without one (one server: see `LockOptions::without_fence`),
    /// computed now for a nested call that can read it, while the key still holds the lease's
    /// token. `Lost` when it no longer does.
    pub(crate) async fn fence_for(&self, lease: &LeaseState) -> Result<u64, LockError> {
        let fence = lease.fence();
        let [node] = self.nodes.as_slice() else {
            return Ok(fence);
        };
        if fence != 0 {
            return Ok(fence);
        }
        let keys = self.keys(lease.key.clone());
        let limit = node.response_timeout();
        match node
            .fence_held(&keys, &lease.token, self.fence_retention_ms, limit)
            .await
        {
            Ok(FenceReply::Fence(fence)) => Ok(lease.set_fence(fence)),
            Ok(FenceReply::NotOurs) => {
                lease.mark_lost(LostReason::NotOwner);
                Err(lease.lost_error(LostReason::NotOwner))
            }
            Ok(FenceReply::Unusable(why)) => Err(LockError::config(
                &lease.name,
                format!(
                    "fence counter `{}` {why}; it was left untouched; use another lock name or \
                     key prefix",
                    keys.fence()
                ),
            )),
            Err(e) => Err(node.redis_error(&lease.name, e)),
        }
    }

    /// Compare-and-delete (or keep for the rest of `min_hold`) on every server at once; held
    /// when a majority confirms. `Lost` when the key was no longer ours.
    pub(crate) async fn release(&self, lease: &LeaseState) -> Result<(), LockError> {
        let how = Release {
            keep_ms: lease.keep_ms(),
            always_publish: self.always_publish(),
            record_fence: if lease.record_fence { lease.fence() } else { 0 },
            fence_retention_ms: self.fence_retention_ms,
            look_at_queue: false,
        };
        // One server decides alone: no shared request, no tally (nothing allocated).
        if let [node] = self.nodes.as_slice() {
            let keys = Keys::new(lease.key.as_str(), self.key_format);
            let mut out = node.release(&keys, &lease.token, &how).await;
            if let Err(dropped) = &out
                && dropped.is_connection_dropped()
            {
                // The connection was gone (its runtime shut down, or the server restarted) and
                // redis-rs is making it again: once more. Compare-and-delete twice is harmless.
                // If the second finds the key not ours, the first may have run after all: the
                // connection failure is the honest answer, not a lost lease.
                out = match node.release(&keys, &lease.token, &how).await {
                    Ok(false) => out,
                    again => again,
                };
            }
            return match out {
                Ok(true) => Ok(()),
                Ok(false) => Err(lease.lost_error(LostReason::GoneAtRelease)),
                Err(e) => Err(self.unavailable(&lease.name, 0, vec![(0, Failure::Redis(e))])),
            };
        }
        let how = Arc::new(how);
        let majority = self.majority;
        let replies = {
            let mut fanout = Fanout::new(self.nodes.iter().map(|node| {
                let node = Arc::clone(node);
                let (keys, token, how) = (
                    self.keys(lease.key.clone()),
                    lease.token.clone(),
                    Arc::clone(&how),
                );
                async move { node.release(&keys, &token, &how).await }
            }));
            fanout
                .until(|replies| majority.settled(Tally::of(replies.iter().map(answer))))
                .await;
            let replies = fanout.take_replies();
            fanout.detach();
            replies
        };
        let t = Tally::of(replies.iter().map(answer));
        match majority.verdict(t) {
            Verdict::Yes => return Ok(()),
            Verdict::No => return Err(lease.lost_error(LostReason::GoneAtRelease)),
            Verdict::OutOfReach | Verdict::Open => {}
        }
        let failures: Vec<(usize, Failure)> = replies
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Err(e)) => Some((i, Failure::Redis(e))),
                _ => None,
            })
            .collect();
        Err(self.unavailable(&lease.name, t.yes, failures))
    }

    /// Subscribes to the release channel on every server at once (one that is down must not
    /// delay the others), for `waiter` (the caller's place in the queue, if any); returns the
    /// subscriptions with their server's index.
    pub(crate) async fn subscribe_all(
        &self,
        channel: &str,
        name: &str,
        waiter: Option<&str>,
    ) -> Vec<(usize, Subscription)> {
        let results = Fanout::new(self.nodes.iter().map(|node| {
            let (node, channel) = (Arc::clone(node), channel.to_owned());
            let waiter = waiter.map(str::to_owned);
            async move { node.subscribe(&channel, waiter.as_deref()).await }
        }))
        .all()
        .await;
        let mut subs = Vec::with_capacity(results.len());
        for (i, (sub, res)) in results.into_iter().enumerate() {
            if let Err(e) = res {
                tracing::debug!(
                    lock = name,
                    node = self.nodes[i].addr(),
                    error = %e,
                    "no release notifications yet (retrying); waiting on the key's ttl meanwhile"
                );
            }
            subs.push((i, sub));
        }
        subs
    }
}

/// One server's yes/no reply, `Some(None)` when its request failed, `None` when still out.
fn answer(reply: &Option<RedisResult<bool>>) -> Option<Option<bool>> {
    reply.as_ref().map(|r| r.as_ref().ok().copied())
}

/// Why one server did not grant a lock.
enum Failure {
    Redis(redis::RedisError),
    /// The key or its fence counter holds data that is not ours.
    Foreign(String),
    Other(String),
    /// Taken, but only `acked` of the `needed` replicas acknowledged it (the key was deleted).
    NotReplicated {
        acked: usize,
        needed: usize,
    },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redis(e) => write!(f, "{e}"),
            Self::Foreign(detail) | Self::Other(detail) => f.write_str(detail),
            Self::NotReplicated { acked, needed } => write!(
                f,
                "taken, but only {acked} of the {needed} replica(s) asked for acknowledged it (deleted again)"
            ),
        }
    }
}

/// One server's renewal of a chunk; a lease released since the round began is left out (its
/// key may be kept for min_hold; the release script also changes such a key's value, so a
/// renewal already on its way cannot stretch it either).
async fn renew_on(node: &Node, chunk: &[Arc<LeaseState>]) -> Vec<Option<RenewReply>> {
    let items: Vec<(&str, &str, u64)> = chunk
        .iter()
        .map(|l| {
            let token = if l.is_ended() { "" } else { l.token.as_str() };
            (l.key.as_str(), token, l.ttl.as_millis() as u64)
        })
        .collect();
    node.renew(&items).await
}

/// Compare-and-delete (or shorten to `keep_ms`) `token` on one server; a failure is logged and
/// left to the key's ttl.
async fn release_quietly(node: &Node, keys: &Keys, token: &str, how: &Release) {
    if let Err(e) = node.release(keys, token, how).await {
        tracing::debug!(node = node.addr(), key = %keys.key, error = %e, "cleanup release failed; the key expires by its ttl");
    }
}
