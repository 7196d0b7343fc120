//! Taking a lock: one attempt (a single node, or Redlock), and waiting for a release.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::fanout::on_all_nodes;
use crate::keys::Keys;
use crate::lease::{LeaseShared, Status, lease_on};
use crate::node::{AcquireReply, AcquireRequest, Node, Subscription, Waiter};
use crate::redlock::{Grant, abandon, redlock_attempt, release_on, settle_late_grants};
use crate::{Lease, LockError, LockOptions, Locker, drift};

/// The outcome of one attempt over all nodes.
pub(crate) enum Attempt {
    Taken(Lease),
    /// Held elsewhere: the shortest remaining PTTL seen (when known), and the nodes that said
    /// busy (only their release messages can change the outcome of the next attempt).
    Busy {
        pttl: Option<Duration>,
        nodes: Vec<usize>,
    },
    /// Free, but another waiter is first in line (one node): retry within this long.
    NotOurTurn {
        retry: Duration,
    },
    /// Granted, but the reply came after the lease's validity ended: not held.
    Expired,
}

/// A place in the lock's waiter queue; leaves it when the wait ends without the lock, also when
/// the waiting future is dropped.
struct QueuePlace {
    node: Arc<Node>,
    keys: Keys,
    waiter: Waiter,
    /// Still in the queue as far as we know (the acquire script removes a waiter that got in).
    queued: bool,
}

impl QueuePlace {
    /// Leaves the queue now (the wait ran out).
    async fn leave(mut self) {
        self.queued = false;
        let _ = self.node.leave_queue(&self.keys, &self.waiter.id).await;
    }

    /// Taken: the acquire script already removed us.
    fn taken(mut self) {
        self.queued = false;
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if !self.queued {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let (node, keys, waiter) = (
                Arc::clone(&self.node),
                self.keys.clone(),
                std::mem::take(&mut self.waiter.id),
            );
            handle.spawn(async move {
                let _ = node.leave_queue(&keys, &waiter).await;
            });
        }
    }
}

/// An acquire request that may have set the key and whose outcome is not settled yet. If it is
/// dropped armed (the caller's future was dropped, timed out or aborted mid-request), it sends a
/// compare-and-delete of its token to every node the request went to. Sent on the same
/// connection right after the request, it reaches the server after it: the key, if the request
/// set it, is gone about one round trip later instead of at the end of its ttl.
struct InFlight {
    locker: Locker,
    keys: Keys,
    token: String,
    armed: bool,
}

impl InFlight {
    fn new(locker: &Locker, keys: &Keys, token: &str) -> Self {
        Self {
            locker: locker.clone(),
            keys: keys.clone(),
            token: token.to_owned(),
            armed: true,
        }
    }

    /// The outcome is settled: someone else (the lease, `abandon`) owns what the request did.
    fn settle(mut self) {
        self.armed = false;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let keys = Arc::new(std::mem::replace(&mut self.keys, Keys::new(String::new())));
        let token: Arc<str> = Arc::from(std::mem::take(&mut self.token));
        // Each node on its own: one that does not answer must not hold up the others.
        for i in 0..self.locker.inner.nodes.len() {
            let (locker, keys, token) =
                (self.locker.clone(), Arc::clone(&keys), Arc::clone(&token));
            handle.spawn(async move { release_on(&locker, i, &keys, &token, 0).await });
        }
    }
}

pub(crate) async fn acquire(
    locker: &Locker,
    name: String,
    opts: &LockOptions,
) -> Result<Lease, LockError> {
    let keys = Keys::new(locker.key_of(&name));
    // One node and a wait: queue up, so that the lock goes to waiters in arrival order.
    let mut place = match locker.inner.nodes.as_slice() {
        [node] if !opts.wait().is_zero() => Some(QueuePlace {
            node: Arc::clone(node),
            keys: keys.clone(),
            waiter: Waiter {
                id: uuid::Uuid::new_v4().simple().to_string(),
                grace: node.waiter_grace(),
            },
            queued: false,
        }),
        _ => None,
    };
    let begun = Instant::now();
    let wait_until = begun + opts.wait();
    let mut subscriptions: Option<Vec<(usize, Subscription)>> = None;
    let mut backoff = Duration::from_millis(10);
    let mut error_backoff = Duration::from_millis(5);
    let mut name = Some(name);
    let result = loop {
        // Only messages from now on tell something about the coming attempt.
        for (_, sub) in subscriptions.iter_mut().flatten() {
            sub.rx.borrow_and_update();
        }
        if let Some(place) = &mut place {
            // A link that got slower asks for a longer grace from now on.
            place.waiter.grace = place.waiter.grace.max(place.node.waiter_grace());
        }
        if let Some(place) = place.as_mut().filter(|_| subscriptions.is_some()) {
            // From now on it may be in the queue, also if this future is dropped mid-attempt.
            place.queued = true;
        }
        // A waiter queues from its second attempt on: by then it listens for releases, and its
        // grace comes from round trips measured on this very wait. An uncontended call never
        // touches the queue.
        let waiter = place
            .as_ref()
            .filter(|_| subscriptions.is_some())
            .map(|p| &p.waiter);
        let outcome = match attempt(locker, &mut name, &keys, waiter, opts).await {
            Ok(outcome) => outcome,
            // No majority this time (Redlock), or the one node failed: within `wait`, try again
            // after a short, growing, jittered pause; when the wait runs out, this error is the
            // answer. With `wait = 0` it is returned at once. A bad key is never retried.
            Err(e @ (LockError::QuorumUnavailable { .. } | LockError::Redis { .. }))
                if !opts.wait().is_zero() =>
            {
                error_backoff = (error_backoff * 2).min(Duration::from_millis(200));
                let retry_at = Instant::now() + error_backoff + jitter(error_backoff);
                tokio::time::sleep_until(retry_at.min(wait_until)).await;
                if Instant::now() >= wait_until {
                    break Err(e);
                }
                continue;
            }
            Err(e) => break Err(e),
        };
        let (retry_after, busy_nodes) = match outcome {
            Attempt::Taken(lease) => break Ok(lease),
            Attempt::Busy { pttl, nodes } => (pttl, nodes),
            Attempt::NotOurTurn { retry } => (Some(retry), vec![0]),
            Attempt::Expired => (Some(Duration::ZERO), Vec::new()),
        };
        let now = Instant::now();
        let busy = || LockError::Busy {
            name: name.clone().unwrap_or_default(),
            waited: begun.elapsed(),
        };
        if opts.wait().is_zero() || now >= wait_until {
            break Err(busy());
        }
        if subscriptions.is_none() {
            // Subscribe before the next try, so that a release between the try and the wait is
            // still seen. Without pub/sub, the PTTL timer below still wakes us.
            subscriptions = Some(subscribe_all(locker, &keys.channel, name.as_deref()).await);
            continue;
        }
        let mut retry_at = match retry_after {
            Some(pttl) => now + pttl + jitter(pttl),
            None => {
                // No TTL on the key (not set by this library): back off, released messages still wake us.
                backoff = (backoff * 2).min(Duration::from_secs(1));
                now + backoff
            }
        };
        if let Some(place) = &place {
            // Come back within the grace, or lose the place in the queue.
            retry_at = retry_at.min(now + place.waiter.grace / 3);
        }
        let subs = subscriptions.as_mut().expect("subscribed above");
        tokio::select! {
            () = tokio::time::sleep_until(retry_at.min(wait_until)) => {}
            () = any_changed(subs, &busy_nodes) => {}
        }
        if Instant::now() >= wait_until {
            break Err(busy());
        }
    };
    // The place in the queue: the acquire script removed it when we got the lock; a wait that ran
    // out leaves now; after any other error the place's drop leaves in the background, so the
    // caller does not wait on a node that may not answer.
    match (&result, place) {
        (Ok(_), Some(place)) => place.taken(),
        (Err(LockError::Busy { .. }), Some(place)) => place.leave().await,
        _ => {}
    }
    result
}

/// Subscribes to the release channel on every node at once (a node that is down must not delay
/// the others); returns the subscriptions with their node's index.
async fn subscribe_all(
    locker: &Locker,
    channel: &str,
    name: Option<&str>,
) -> Vec<(usize, Subscription)> {
    let nodes = &locker.inner.nodes;
    let results = on_all_nodes(nodes, |node| {
        let channel = channel.to_owned();
        async move { node.subscribe(&channel).await }
    })
    .await;
    let mut subs = Vec::with_capacity(nodes.len());
    for (i, (sub, res)) in results.into_iter().enumerate() {
        if let Err(e) = res {
            tracing::debug!(
                lock = name.unwrap_or_default(),
                node = nodes[i].addr(),
                error = %e,
                "no release notifications yet (retrying); waiting on the key's ttl meanwhile"
            );
        }
        subs.push((i, sub));
    }
    subs
}

/// Resolves on a release message from one of the `busy` nodes. Messages from the other nodes are
/// ignored: they cannot turn the next attempt into a success, and among them are the releases of
/// this waiter's own partial grants, which would otherwise wake it again and again (a busy loop
/// for as long as someone else holds the majority).
async fn any_changed(subs: &mut [(usize, Subscription)], busy: &[usize]) {
    let mut relevant: Vec<&mut Subscription> = subs
        .iter_mut()
        .filter(|(i, _)| busy.contains(i))
        .map(|(_, s)| s)
        .collect();
    match relevant.as_mut_slice() {
        [] => std::future::pending().await,
        [one] => {
            let _ = one.rx.changed().await;
        }
        many => {
            // Keep every `changed` future alive across polls: dropping one unregisters its waker.
            let mut waits: Vec<_> = many.iter_mut().map(|s| Box::pin(s.rx.changed())).collect();
            std::future::poll_fn(|cx| {
                if waits.iter_mut().any(|w| w.as_mut().poll(cx).is_ready()) {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            })
            .await;
        }
    }
}

/// Up to 5 ms + 1/20 of the wait, so waiters that saw the same PTTL do not retry in lockstep.
fn jitter(pttl: Duration) -> Duration {
    let spread = Duration::from_millis(5) + pttl / 20;
    let r = (uuid::Uuid::new_v4().as_u128() as u64) % (spread.as_micros() as u64 + 1);
    Duration::from_micros(r)
}

async fn attempt(
    locker: &Locker,
    name: &mut Option<String>,
    keys: &Keys,
    waiter: Option<&Waiter>,
    opts: &LockOptions,
) -> Result<Attempt, LockError> {
    let ttl = opts.ttl();
    let ttl_ms = ttl.as_millis() as u64;
    let drift = drift(ttl);
    let validity = ttl.saturating_sub(drift);
    let token = uuid::Uuid::new_v4().simple().to_string();
    let nodes = &locker.inner.nodes;
    let sent = Instant::now();
    let lock_name = name.as_deref().unwrap_or_default();
    // Armed until the outcome is settled: dropped mid-request, it undoes what the request did.
    let in_flight = InFlight::new(locker, keys, &token);

    let grant = if let [node] = nodes.as_slice() {
        // A reply later than the validity window is useless: bound the wait by it.
        let limit = node.response_timeout().min(validity);
        let evict = locker.inner.stale_heads.evictable(&keys.key);
        let request = AcquireRequest {
            token: &token,
            ttl_ms,
            waiter,
            evict: evict.as_ref().map(|(h, s)| (h.as_str(), s.as_str())),
            fence_quantum: 1,
            fence_retention_ms: locker.fence_retention_ms(),
            limit,
        };
        match node.acquire(keys, &request).await {
            Ok(AcquireReply::Taken { fence }) => {
                locker.inner.stale_heads.forget(&keys.key);
                Grant {
                    fence,
                    nodes: vec![0],
                    late: JoinSet::new(),
                }
            }
            Ok(AcquireReply::Busy { pttl }) => {
                in_flight.settle();
                return Ok(Attempt::Busy {
                    pttl,
                    nodes: vec![0],
                });
            }
            Ok(AcquireReply::NotOurTurn { head, state }) => {
                in_flight.settle();
                let retry = locker.inner.stale_heads.seen(&keys.key, head, state);
                return Ok(Attempt::NotOurTurn { retry });
            }
            Ok(AcquireReply::Foreign { detail }) => {
                in_flight.settle();
                return Err(LockError::config(
                    lock_name,
                    format!("{detail}; use another lock name or key prefix"),
                ));
            }
            Err(e) => {
                // The request may still have been applied: remove our token if it is there,
                // without making the caller wait for a node that may not answer.
                in_flight.settle();
                abandon(locker, keys, &token, &[], vec![0], JoinSet::new(), limit).await;
                return Err(node.redis_error(lock_name, e));
            }
        }
    } else {
        match redlock_attempt(locker, lock_name, keys, &token, ttl_ms, validity).await? {
            Ok(grant) => grant,
            Err(busy) => {
                // A failed Redlock attempt cleaned up after itself (`abandon`).
                in_flight.settle();
                return Ok(busy);
            }
        }
    };

    let valid_until = sent + validity;
    if Instant::now() >= valid_until {
        let limit = nodes[0].response_timeout().min(validity);
        in_flight.settle();
        abandon(
            locker,
            keys,
            &token,
            &grant.nodes,
            Vec::new(),
            grant.late,
            limit,
        )
        .await;
        return Ok(Attempt::Expired);
    }
    let (status, _) = watch::channel(Status {
        valid_until,
        lost: None,
    });
    let shared = LeaseShared {
        name: name.take().unwrap_or_default(),
        key: keys.key.clone(),
        channel: keys.channel.clone(),
        token,
        fence: grant.fence,
        ttl,
        renew: opts.renew(),
        drift,
        started: sent,
        min_hold: opts.min_hold(),
        status,
        ended: AtomicBool::new(false),
        slot: std::sync::Mutex::new(None),
    };
    let lease = lease_on(locker, shared);
    // From here on the lease releases the key on every path, including its own drop.
    in_flight.settle();
    if !grant.late.is_empty() {
        tokio::spawn(settle_late_grants(
            locker.clone(),
            Arc::clone(&lease.shared),
            grant.late,
        ));
    }
    Ok(Attempt::Taken(lease))
}

/// Queue heads this locker saw in front of a free lock, per key, with when it first saw each
/// one in that state. A head whose state stays the same for longer than its grace, on this
/// process's monotonic clock, has stopped coming back: the next attempt asks the server to evict
/// it (which it does only if the state is still the one seen). No server clock is involved, so
/// a server clock step cannot keep a vanished waiter's place alive.
#[derive(Default)]
pub(crate) struct StaleHeads {
    seen: std::sync::Mutex<std::collections::HashMap<String, Seen>>,
}

struct Seen {
    head: String,
    state: String,
    since: Instant,
    grace: Duration,
}

/// Entries kept at most; past that the map starts over (it only ever delays an eviction).
const STALE_HEADS_MAX: usize = 4096;

impl StaleHeads {
    /// Records that `head` was first in line for `key` with `state`; returns how long until it
    /// may be evicted if it does not come back.
    pub(crate) fn seen(&self, key: &str, head: String, state: String) -> Duration {
        let now = Instant::now();
        let mut seen = self.seen.lock().expect("stale heads lock");
        if let Some(s) = seen.get(key)
            && s.head == head
            && s.state == state
        {
            return (s.since + s.grace).saturating_duration_since(now);
        }
        if seen.len() >= STALE_HEADS_MAX {
            seen.clear();
        }
        // The state is "<nonce> <grace ms>"; an unreadable one gets the least grace.
        let grace = state
            .rsplit(' ')
            .next()
            .and_then(|ms| ms.parse().ok())
            .map_or(crate::node::MIN_WAITER_GRACE, Duration::from_millis);
        let since = now;
        seen.insert(
            key.to_owned(),
            Seen {
                head,
                state,
                since,
                grace,
            },
        );
        grace
    }

    /// The head to evict for `key`, with the state it was seen in, if it outstayed its grace.
    pub(crate) fn evictable(&self, key: &str) -> Option<(String, String)> {
        let seen = self.seen.lock().expect("stale heads lock");
        let s = seen.get(key)?;
        (Instant::now() >= s.since + s.grace).then(|| (s.head.clone(), s.state.clone()))
    }

    pub(crate) fn forget(&self, key: &str) {
        self.seen.lock().expect("stale heads lock").remove(key);
    }
}
