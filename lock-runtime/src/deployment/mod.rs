//! A deployment: the servers a lock lives on, and the one place that decides each set of replies.
//!
//! Each kind of deployment is a module that makes a [`Deployment`] with its [`Traits`]: one
//! server ([`standalone`]), a Redis Cluster ([`cluster`]), the primary Sentinel names
//! ([`sentinel`]), N independent servers ([`redlock`]), a server in this process for users'
//! tests ([`in_memory`]). Nothing here or above asks which kind
//! it is: what differs is in the traits. A single logical server is simply N = 1; Redlock's N
//! servers hold a lock with a majority `N/2 + 1` of the configured N (not of the reachable
//! ones). Every request goes to all servers at once and is decided as soon as the replies so far
//! decide it, so that one slow or silent server never holds up a decision the others made.
//!
//! [`Deployment`]: crate::deployment::Deployment
//! [`Traits`]: crate::deployment::Traits
//! [`standalone`]: crate::deployment::standalone
//! [`cluster`]: crate::deployment::cluster
//! [`sentinel`]: crate::deployment::sentinel
//! [`redlock`]: crate::deployment::redlock
//! [`in_memory`]: crate::deployment::in_memory

mod acquire;
pub(crate) mod cluster;
mod exclusive;
mod failure;
pub(crate) mod in_memory;
mod majority;
#[cfg(test)]
mod majority_props;
mod mode;
mod permits;
pub(crate) mod redlock;
mod release;
mod renew;
mod replies;
pub(crate) mod sentinel;
mod shared;
pub(crate) mod standalone;

use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;
use tokio::time::Instant;

use crate::LockError;
use crate::model::hold::{Held, HoldKind};
use crate::model::keys::{KeyFormat, Keys};
use crate::model::waiter::Waiter;
use crate::plumbing::deadlines::Deadlines;
use crate::plumbing::fanout::Fanout;
use crate::server::{AcquireReply, AcquireRequest, Release};

// The server-side types of this layer's interface, which the layers above reach only through
// here: the servers a deployment lists (`nodes`, `queue_node`: the fair queue and inspection
// talk to one of them), the release subscriptions `subscribe_all` hands out and what wakes
// them, and what a deployment is made with (`Setup`).
pub(crate) use crate::server::Node;
pub(crate) use crate::server::pubsub::{Grant, Subscription, Wake};
pub(crate) use crate::server::scripts::DEFAULT_RETENTION_MS as DEFAULT_FENCE_RETENTION_MS;
pub(crate) use crate::transport::connect::Settings;
use failure::Failure;
use majority::Majority;

/// The servers of one locker and the majority it needs.
pub(crate) struct Deployment {
    nodes: Vec<Arc<Node>>,
    majority: Majority,
    traits: Traits,
    /// How long an unused fence counter is kept; 0 forever.
    fence_retention_ms: u64,
    /// How lock names become keys (and so where the derived keys live).
    key_format: KeyFormat,
}

/// What sets one kind of deployment apart; each kind's module gives its own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Traits {
    /// One place decides who is first, so waiters queue there in arrival order (the servers of
    /// a majority could disagree on who is first).
    pub fair_queue: bool,
    /// An uncontended acquire may be plain commands (`SET NX`) instead of the script.
    pub plain_commands: bool,
    /// Every release is published: nobody queues, so a release cannot tell who listens.
    pub always_publish: bool,
    /// The granularity of a fence computed from a server's clock, in µs.
    pub fence_quantum_us: u64,
    /// How many leases one renewal call takes.
    pub renew_chunk: usize,
}

/// What every kind of deployment is made with.
pub(crate) struct Setup<'a> {
    pub settings: Settings,
    pub tls_root_cert: Option<&'a [u8]>,
    /// How many replicas must acknowledge each acquire and renewal.
    pub replicas: usize,
    /// How long an unused fence counter is kept; 0 forever.
    pub fence_retention_ms: u64,
    pub key_format: KeyFormat,
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
    /// What the hold takes (see `LockOptions::with_permits`, `LockOptions::with_shared`).
    pub kind: HoldKind,
}

/// The decided outcome of one acquire attempt.
pub(crate) enum Acquired {
    /// A majority granted it: the fence, the servers that granted it, and the requests still
    /// out (late grants are part of the lease: renewed and released with the rest).
    Granted {
        fence: u64,
        /// Taken by the plain-command path: no waiter had queued then (its release tries the
        /// short script first), and the fence counter is written at release.
        plain: bool,
        nodes: Vec<usize>,
        late: Late,
        held: Held,
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

/// What a renewal round decided: one [`Renewal`] per lease, and the last server error met.
pub(crate) struct Renewals {
    pub verdicts: Vec<Renewal>,
    /// The last error of a server whose call failed (why a lease may be `Undecided`).
    pub error: Option<redis::RedisError>,
}

impl Deployment {
    /// The deployment of `nodes`, which share one schedule of request bounds.
    fn new(nodes: Vec<Node>, traits: Traits, setup: &Setup<'_>) -> Self {
        Self {
            majority: Majority::of(nodes.len()),
            nodes: nodes
                .into_iter()
                .map(|mut node| {
                    node.set_fence_retention(setup.fence_retention_ms);
                    Arc::new(node)
                })
                .collect(),
            traits,
            fence_retention_ms: setup.fence_retention_ms,
            key_format: setup.key_format,
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
    pub(super) fn cleanup(&self, keep_ms: u64) -> Release {
        Release {
            keep_ms,
            always_publish: self.traits.always_publish,
            record_fence: 0,
            fence_retention_ms: self.fence_retention_ms,
            // An undo is rare; waiters queued meanwhile may not have marked the value.
            look_at_queue: true,
            short_first: false,
        }
    }

    /// How many servers must grant a lock: `N/2 + 1` of N (1 of 1).
    pub(crate) fn needed(&self) -> usize {
        self.majority.needed()
    }

    pub(crate) fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// How long a decision takes: the recent round trip of the server that completes a
    /// majority (the `needed`-th fastest).
    pub(crate) fn rtt(&self) -> Duration {
        if let Some(node) = self.alone() {
            return node.rtt();
        }
        let mut rtts: Vec<Duration> = self.nodes.iter().map(|node| node.rtt()).collect();
        rtts.sort_unstable();
        rtts[self.majority.needed() - 1]
    }

    /// How many leases the watchdog hands to one [`Self::renew`] call.
    pub(crate) fn renew_chunk(&self) -> usize {
        self.traits.renew_chunk
    }

    /// The server of the fair waiter queue, if this kind has one.
    pub(crate) fn queue_node(&self) -> Option<&Arc<Node>> {
        self.traits.fair_queue.then(|| &self.nodes[0])
    }

    /// How long a request may wait for its reply.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.nodes[0].response_timeout()
    }

    /// The one server that decides alone (N = 1): its reply is the decision, with nothing to
    /// tally, and its error is the deployment's.
    pub(super) fn alone(&self) -> Option<&Arc<Node>> {
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
        match self.alone() {
            Some(_) => self.per_node_limit(validity),
            None => self.nodes[0].response_timeout() * 3,
        }
    }

    /// An attempt of `ask` on the one server of a lock with permits or a shared hold (see
    /// `Deployment::one_server`), bounded as an attempt on one server is.
    pub(super) fn one_server_request<'a>(&self, ask: &Ask<'a>) -> AcquireRequest<'a> {
        AcquireRequest {
            token: ask.token,
            ttl_ms: ask.ttl_ms,
            waiter: ask.waiter,
            evict: ask.evict,
            fence_quantum: self.traits.fence_quantum_us,
            fence_retention_ms: self.fence_retention_ms,
            limit: self.per_node_limit(ask.validity),
            queue: true,
        }
    }

    /// The most any one request may take: with one server, the whole validity window; with
    /// several, a tenth of it, so that slow servers cannot eat the lease.
    pub(super) fn per_node_limit(&self, validity: Duration) -> Duration {
        let share = match self.alone() {
            Some(_) => validity,
            None => (validity / 10).max(Duration::from_millis(2)),
        };
        self.nodes[0].response_timeout().min(share)
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
        if self.alone().is_some() && !failures.is_empty() {
            return Err(failures.remove(0).1);
        }
        if self.majority.reached(got) {
            return Ok(());
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
                    target: "lock_runtime::acquire",
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
