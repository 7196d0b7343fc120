//! Taking a lock: one attempt (a single node, or Redlock), and waiting for a release.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::fanout::on_all_nodes;
use crate::lease::{LeaseShared, Status, lease_on};
use crate::node::{AcquireReply, Node, Subscription, WAITER_GRACE};
use crate::redlock::{Grant, abandon, redlock_attempt, settle_late_grants};
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
    /// Granted, but the reply came after the lease's validity ended: not held.
    Expired,
}

#[derive(Clone)]
/// The Redis names of one lock: its key, fence counter and release channel.
pub(crate) struct Keys {
    pub(crate) key: String,
    pub(crate) fence_key: String,
    pub(crate) channel: String,
    /// Waiters in arrival order (a sorted set), and when each one's place runs out.
    pub(crate) queue: String,
    pub(crate) queue_deadlines: String,
}

impl Keys {
    pub(crate) fn new(key: String) -> Self {
        Self {
            fence_key: format!("{key}:fence"),
            channel: format!("{key}:released"),
            queue: format!("{key}:waiters"),
            queue_deadlines: format!("{key}:waiters:until"),
            key,
        }
    }
}

/// A place in the lock's waiter queue; leaves it when the wait ends without the lock, also when
/// the waiting future is dropped.
struct QueuePlace {
    node: Arc<Node>,
    keys: Keys,
    waiter: String,
    /// Still in the queue as far as we know (the acquire script removes a waiter that got in).
    queued: bool,
}

impl QueuePlace {
    /// Leaves the queue now (the wait ran out).
    async fn leave(mut self) {
        self.queued = false;
        let _ = self.node.leave_queue(&self.keys, &self.waiter).await;
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
                std::mem::take(&mut self.waiter),
            );
            handle.spawn(async move {
                let _ = node.leave_queue(&keys, &waiter).await;
            });
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
    let place = match locker.inner.nodes.as_slice() {
        [node] if !opts.wait().is_zero() => Some(QueuePlace {
            node: Arc::clone(node),
            keys: keys.clone(),
            waiter: uuid::Uuid::new_v4().simple().to_string(),
            queued: true,
        }),
        _ => None,
    };
    let waiter = place.as_ref().map_or("", |p| p.waiter.as_str());
    let begun = Instant::now();
    let wait_until = begun + opts.wait();
    let mut subscriptions: Option<Vec<(usize, Subscription)>> = None;
    let mut backoff = Duration::from_millis(10);
    let mut unavailable_backoff = Duration::from_millis(5);
    let mut name = Some(name);
    let result = loop {
        // Only messages from now on tell something about the coming attempt.
        for (_, sub) in subscriptions.iter_mut().flatten() {
            sub.rx.borrow_and_update();
        }
        let outcome = match attempt(locker, &mut name, &keys, waiter, opts).await {
            Ok(outcome) => outcome,
            // Redlock: no majority this time (nodes down or slow, or one failed mid-attempt).
            // Within `wait`, try again after a short, growing, jittered pause; when the wait runs
            // out, this error is the answer. With `wait = 0` it is returned at once.
            Err(e @ LockError::QuorumUnavailable { .. }) if !opts.wait().is_zero() => {
                unavailable_backoff = (unavailable_backoff * 2).min(Duration::from_millis(200));
                let retry_at = Instant::now() + unavailable_backoff + jitter(unavailable_backoff);
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
        if place.is_some() {
            // Come back within the grace, or lose the place in the queue.
            retry_at = retry_at.min(now + WAITER_GRACE / 3);
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
    for (i, res) in results.into_iter().enumerate() {
        match res {
            Ok(sub) => subs.push((i, sub)),
            Err(e) => tracing::debug!(
                lock = name.unwrap_or_default(),
                node = nodes[i].addr(),
                error = %e,
                "no release notifications; waiting on the key's ttl"
            ),
        }
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
    waiter: &str,
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

    let grant = if let [node] = nodes.as_slice() {
        // A reply later than the validity window is useless: bound the wait by it.
        let limit = node.response_timeout().min(validity);
        match node.acquire(keys, &token, ttl_ms, waiter, limit).await {
            Ok(AcquireReply::Taken { fence }) => Grant {
                fence,
                nodes: vec![0],
                late: JoinSet::new(),
            },
            Ok(AcquireReply::Busy { pttl }) => {
                return Ok(Attempt::Busy {
                    pttl,
                    nodes: vec![0],
                });
            }
            Ok(AcquireReply::Foreign { detail }) => {
                return Err(LockError::config(
                    lock_name,
                    format!("{detail}; use another lock name or key prefix"),
                ));
            }
            Err(e) => {
                // The request may still have been applied: remove our token if it is there,
                // without making the caller wait for a node that may not answer.
                abandon(locker, keys, &token, &[], vec![0], JoinSet::new(), limit).await;
                return Err(node.redis_error(lock_name, e));
            }
        }
    } else {
        match redlock_attempt(locker, lock_name, keys, &token, ttl_ms, validity).await? {
            Ok(grant) => grant,
            Err(busy) => return Ok(busy),
        }
    };

    let valid_until = sent + validity;
    if Instant::now() >= valid_until {
        let limit = nodes[0].response_timeout().min(validity);
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
    if !grant.late.is_empty() {
        tokio::spawn(settle_late_grants(
            locker.clone(),
            Arc::clone(&lease.shared),
            grant.late,
        ));
    }
    Ok(Attempt::Taken(lease))
}
