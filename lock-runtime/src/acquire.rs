//! Taking a lock: one round trip per node, Redlock's majority rule, and waiting for a release.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::lease::{LeaseShared, Status, lease_on};
use crate::node::{AcquireReply, Node, Subscription};
use crate::{Lease, LockError, LockOptions, Locker, drift};

/// Runs `f` on every node at once; results in node order.
pub(crate) async fn on_all_nodes<T, F, Fut>(nodes: &[Arc<Node>], f: F) -> Vec<T>
where
    F: Fn(Arc<Node>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut set = JoinSet::new();
    for (i, node) in nodes.iter().enumerate() {
        let fut = f(Arc::clone(node));
        set.spawn(async move { (i, fut.await) });
    }
    let mut out: Vec<Option<T>> = (0..nodes.len()).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((i, v)) => out[i] = Some(v),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    out.into_iter()
        .map(|v| v.expect("every node task finished"))
        .collect()
}

/// The outcome of one attempt over all nodes.
enum Attempt {
    Taken(Lease),
    /// Held elsewhere; the shortest remaining PTTL seen, when known.
    Busy(Option<Duration>),
    /// Granted, but the reply came after the lease's validity ended: not held.
    Expired,
}

struct Keys {
    key: String,
    fence_key: String,
    channel: String,
}

pub(crate) async fn acquire(
    locker: &Locker,
    name: String,
    opts: &LockOptions,
) -> Result<Lease, LockError> {
    let key = locker.key_of(&name);
    let keys = Keys {
        fence_key: format!("{key}:fence"),
        channel: format!("{key}:released"),
        key,
    };
    let begun = Instant::now();
    let wait_until = begun + opts.wait_for();
    let mut subscriptions: Option<Vec<Subscription>> = None;
    let mut backoff = Duration::from_millis(10);
    let mut name = Some(name);
    loop {
        let retry_after = match attempt(locker, &mut name, &keys, opts).await? {
            Attempt::Taken(lease) => return Ok(lease),
            Attempt::Busy(pttl) => pttl,
            Attempt::Expired => Some(Duration::ZERO),
        };
        let now = Instant::now();
        let busy = || LockError::Busy {
            name: name.clone().unwrap_or_default(),
            waited: begun.elapsed(),
        };
        if opts.wait_for().is_zero() || now >= wait_until {
            return Err(busy());
        }
        if subscriptions.is_none() {
            // Subscribe before the next try, so that a release between the try and the wait is
            // still seen. Without pub/sub, the PTTL timer below still wakes us.
            subscriptions = Some(subscribe_all(locker, &keys.channel, name.as_deref()).await);
            continue;
        }
        let retry_at = match retry_after {
            Some(pttl) => now + pttl + jitter(pttl),
            None => {
                // No TTL on the key (not set by this library): back off, released messages still wake us.
                backoff = (backoff * 2).min(Duration::from_secs(1));
                now + backoff
            }
        };
        let subs = subscriptions.as_mut().expect("subscribed above");
        tokio::select! {
            () = tokio::time::sleep_until(retry_at.min(wait_until)) => {}
            () = any_changed(subs) => {}
        }
        if Instant::now() >= wait_until {
            return Err(busy());
        }
    }
}

async fn subscribe_all(locker: &Locker, channel: &str, name: Option<&str>) -> Vec<Subscription> {
    let mut subs = Vec::with_capacity(locker.inner.nodes.len());
    for node in &locker.inner.nodes {
        match node.subscribe(channel).await {
            Ok(sub) => subs.push(sub),
            Err(e) => tracing::debug!(
                lock = name.unwrap_or_default(),
                node = node.addr(),
                error = %e,
                "no release notifications; waiting on the key's ttl"
            ),
        }
    }
    subs
}

async fn any_changed(subs: &mut [Subscription]) {
    match subs {
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

    let fence = if let [node] = nodes.as_slice() {
        // A reply later than the validity window is useless: bound the wait by it.
        let limit = node.response_timeout().min(validity);
        match node
            .acquire(&keys.key, &keys.fence_key, &token, ttl_ms, limit)
            .await
        {
            Ok(AcquireReply::Taken { fence }) => fence,
            Ok(AcquireReply::Busy { pttl }) => return Ok(Attempt::Busy(pttl)),
            Ok(AcquireReply::Foreign { detail }) => {
                return Err(LockError::config(
                    lock_name,
                    format!("{detail}; use another lock name or key prefix"),
                ));
            }
            Err(e) => {
                // The request may still have been applied: remove our token if it is there,
                // without making the caller wait for a node that may not answer.
                let (locker, key, fence_key, channel, token) = (
                    locker.clone(),
                    keys.key.clone(),
                    keys.fence_key.clone(),
                    keys.channel.clone(),
                    token.clone(),
                );
                tokio::spawn(async move {
                    release_everywhere(
                        &locker,
                        &Keys {
                            key,
                            fence_key,
                            channel,
                        },
                        &token,
                    )
                    .await;
                });
                return Err(node.redis_error(lock_name, e));
            }
        }
    } else {
        match redlock_attempt(locker, lock_name, keys, &token, ttl_ms, validity).await? {
            Ok(fence) => fence,
            Err(busy) => return Ok(busy),
        }
    };

    let valid_until = sent + validity;
    if Instant::now() >= valid_until {
        release_everywhere(locker, keys, &token).await;
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
        fence,
        ttl,
        renew: opts.renew_every(),
        drift,
        started: sent,
        min_hold: opts.min_hold_for(),
        status,
        ended: AtomicBool::new(false),
        slot: std::sync::Mutex::new(None),
    };
    Ok(Attempt::Taken(lease_on(locker, shared)))
}

/// Redlock: ask every node at once; the lock holds with `N/2 + 1` grants of the configured N.
/// Returns the fence, or the busy outcome; a majority out of reach is `QuorumUnavailable`.
async fn redlock_attempt(
    locker: &Locker,
    name: &str,
    keys: &Keys,
    token: &str,
    ttl_ms: u64,
    validity: Duration,
) -> Result<Result<u64, Attempt>, LockError> {
    let nodes = &locker.inner.nodes;
    let needed = locker.quorum();
    // A small fraction of the ttl, so that slow nodes cannot eat the validity window.
    let per_node = (validity / 10).max(Duration::from_millis(2));
    let mut set = JoinSet::new();
    for (i, node) in nodes.iter().enumerate() {
        let node = Arc::clone(node);
        let (key, fence_key, token) = (keys.key.clone(), keys.fence_key.clone(), token.to_owned());
        let limit = node.response_timeout().min(per_node);
        set.spawn(async move {
            (
                i,
                node.acquire(&key, &fence_key, &token, ttl_ms, limit).await,
            )
        });
    }
    let mut granted: Vec<(usize, u64)> = Vec::new();
    let mut busy_pttl: Option<Option<Duration>> = None;
    let mut failures = Vec::new();
    let mut answered = 0;
    while let Some(joined) = set.join_next().await {
        answered += 1;
        let Ok((i, reply)) = joined else { continue };
        match reply {
            Ok(AcquireReply::Taken { fence }) => granted.push((i, fence)),
            Ok(AcquireReply::Busy { pttl }) => {
                busy_pttl = Some(match busy_pttl {
                    Some(Some(prev)) => Some(pttl.map_or(prev, |p| p.min(prev))),
                    _ => pttl,
                });
            }
            Ok(AcquireReply::Foreign { detail }) => {
                failures.push((nodes[i].addr().to_owned(), detail))
            }
            Err(e) => failures.push((nodes[i].addr().to_owned(), e.to_string())),
        }
        let pending = nodes.len() - answered;
        if granted.len() >= needed || granted.len() + pending < needed {
            break;
        }
    }
    if granted.len() >= needed {
        // Late replies no longer matter; the stragglers' grants are ours and renewed or released
        // with the rest (release goes to every node).
        set.detach_all();
        let fence = granted.iter().map(|&(_, f)| f).max().unwrap_or(0);
        if raise_fences(locker, &granted, &keys.fence_key, fence, per_node).await >= needed {
            return Ok(Ok(fence));
        }
        failures.push((
            "fence".to_owned(),
            "could not raise the fence counter on a majority".to_owned(),
        ));
    } else {
        set.detach_all();
    }
    release_everywhere(locker, keys, token).await;
    if nodes.len() - failures.len() >= needed
        && let Some(pttl) = busy_pttl
    {
        return Ok(Err(Attempt::Busy(pttl)));
    }
    Err(LockError::QuorumUnavailable {
        name: name.to_owned(),
        got: granted.len(),
        needed,
        failures,
    })
}

/// Raises the fence counter of every granted node to `fence`, so that the next majority, which
/// meets this one on at least one node, counts past it. Returns how many nodes are now at it.
async fn raise_fences(
    locker: &Locker,
    granted: &[(usize, u64)],
    fence_key: &str,
    fence: u64,
    limit: Duration,
) -> usize {
    let nodes: Vec<Arc<Node>> = granted
        .iter()
        .map(|&(i, _)| Arc::clone(&locker.inner.nodes[i]))
        .collect();
    let results = on_all_nodes(&nodes, |node| {
        let fence_key = fence_key.to_owned();
        async move { node.raise_fence(&fence_key, fence, limit).await }
    })
    .await;
    results.iter().filter(|r| r.is_ok()).count()
}

/// Compare-and-delete `token` on every node; failures are left to the ttl.
async fn release_everywhere(locker: &Locker, keys: &Keys, token: &str) {
    let results = on_all_nodes(&locker.inner.nodes, |node| {
        let (key, channel, token) = (keys.key.clone(), keys.channel.clone(), token.to_owned());
        async move { node.release(&key, &token, 0, &channel).await }
    })
    .await;
    for (node, res) in locker.inner.nodes.iter().zip(results) {
        if let Err(e) = res {
            tracing::debug!(node = node.addr(), key = %keys.key, error = %e, "cleanup release failed; the key expires by its ttl");
        }
    }
}
