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

/// Runs `f` on every node at once and returns as soon as `settled` says that the replies so far
/// decide the outcome (a majority), or when every node has replied: one slow or unreachable node
/// must not hold up a decision the others already made. Requests still out go on in the
/// background. Results in node order; `None` for a node that had not replied yet.
pub(crate) async fn on_nodes_until<T, F, Fut, S>(
    nodes: &[Arc<Node>],
    f: F,
    mut settled: S,
) -> Vec<Option<T>>
where
    F: Fn(Arc<Node>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    S: FnMut(&[Option<T>]) -> bool,
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
        if settled(&out) {
            break;
        }
    }
    set.detach_all();
    out
}

/// The outcome of one attempt over all nodes.
enum Attempt {
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

/// Acquire requests still out when an attempt was decided: `(node index, reply)`.
type Late = JoinSet<(usize, redis::RedisResult<AcquireReply>)>;

/// A lock granted by one node, or by a majority.
struct Grant {
    fence: u64,
    /// The nodes that granted it before the attempt was decided.
    nodes: Vec<usize>,
    /// Requests to the other nodes, still out.
    late: Late,
}

#[derive(Clone)]
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
    let mut subscriptions: Option<Vec<(usize, Subscription)>> = None;
    let mut backoff = Duration::from_millis(10);
    let mut unavailable_backoff = Duration::from_millis(5);
    let mut name = Some(name);
    loop {
        // Only messages from now on tell something about the coming attempt.
        for (_, sub) in subscriptions.iter_mut().flatten() {
            sub.rx.borrow_and_update();
        }
        let outcome = match attempt(locker, &mut name, &keys, opts).await {
            Ok(outcome) => outcome,
            // Redlock: no majority this time (nodes down or slow, or one failed mid-attempt).
            // Within `wait`, try again after a short, growing, jittered pause; when the wait runs
            // out, this error is the answer. With `wait = 0` it is returned at once.
            Err(e @ LockError::QuorumUnavailable { .. }) if !opts.wait_for().is_zero() => {
                unavailable_backoff = (unavailable_backoff * 2).min(Duration::from_millis(200));
                let retry_at = Instant::now() + unavailable_backoff + jitter(unavailable_backoff);
                tokio::time::sleep_until(retry_at.min(wait_until)).await;
                if Instant::now() >= wait_until {
                    return Err(e);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        let (retry_after, busy_nodes) = match outcome {
            Attempt::Taken(lease) => return Ok(lease),
            Attempt::Busy { pttl, nodes } => (pttl, nodes),
            Attempt::Expired => (Some(Duration::ZERO), Vec::new()),
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
            () = any_changed(subs, &busy_nodes) => {}
        }
        if Instant::now() >= wait_until {
            return Err(busy());
        }
    }
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
        match node
            .acquire(&keys.key, &keys.fence_key, &token, ttl_ms, limit)
            .await
        {
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
        renew: opts.renew_every(),
        drift,
        started: sent,
        min_hold: opts.min_hold_for(),
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

/// Redlock: ask every node at once; the lock holds with `N/2 + 1` grants of the configured N.
/// Returns the grant, or the busy outcome; a majority out of reach is `QuorumUnavailable`.
/// Decides as soon as a majority granted or is out of reach; a failed attempt deletes what it
/// took before it returns (and on the nodes still out, as soon as they answer).
async fn redlock_attempt(
    locker: &Locker,
    name: &str,
    keys: &Keys,
    token: &str,
    ttl_ms: u64,
    validity: Duration,
) -> Result<Result<Grant, Attempt>, LockError> {
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
    let mut busy_nodes = Vec::new();
    let mut failures = Vec::new();
    // Nodes whose request failed in a way that may still have set the key (e.g. a timeout).
    let mut unsure = Vec::new();
    let mut answered = 0;
    while let Some(joined) = set.join_next().await {
        answered += 1;
        let Ok((i, reply)) = joined else { continue };
        match reply {
            Ok(AcquireReply::Taken { fence }) => granted.push((i, fence)),
            Ok(AcquireReply::Busy { pttl }) => {
                busy_nodes.push(i);
                busy_pttl = Some(match busy_pttl {
                    Some(Some(prev)) => Some(pttl.map_or(prev, |p| p.min(prev))),
                    _ => pttl,
                });
            }
            Ok(AcquireReply::Foreign { detail }) => {
                failures.push((nodes[i].addr().to_owned(), detail))
            }
            Err(e) => {
                unsure.push(i);
                failures.push((nodes[i].addr().to_owned(), e.to_string()));
            }
        }
        let pending = nodes.len() - answered;
        if granted.len() >= needed || granted.len() + pending < needed {
            break;
        }
    }
    let granted_nodes: Vec<usize> = granted.iter().map(|&(i, _)| i).collect();
    if granted.len() >= needed {
        // The requests still out go on: a late grant is part of the lease, renewed and
        // released with the rest (see `settle_late_grants`).
        let fence = granted.iter().map(|&(_, f)| f).max().unwrap_or(0);
        let raise_failures = raise_fences(locker, &granted, &keys.fence_key, fence, per_node).await;
        if granted.len() - raise_failures.len() >= needed {
            return Ok(Ok(Grant {
                fence,
                nodes: granted_nodes,
                late: set,
            }));
        }
        failures.extend(raise_failures.into_iter().map(|(addr, e)| {
            let why = format!("granted, but raising the fence counter failed: {e}");
            (addr, why)
        }));
    }
    abandon(locker, keys, token, &granted_nodes, unsure, set, per_node).await;
    if nodes.len() - failures.len() >= needed
        && let Some(pttl) = busy_pttl
    {
        return Ok(Err(Attempt::Busy {
            pttl,
            nodes: busy_nodes,
        }));
    }
    Err(LockError::QuorumUnavailable {
        name: name.to_owned(),
        got: granted.len(),
        needed,
        failures,
    })
}

/// Raises the fence counter of every granted node to `fence`, so that the next majority, which
/// meets this one on at least one node, counts past it. Returns the nodes where it failed, and why.
async fn raise_fences(
    locker: &Locker,
    granted: &[(usize, u64)],
    fence_key: &str,
    fence: u64,
    limit: Duration,
) -> Vec<(String, String)> {
    let nodes: Vec<Arc<Node>> = granted
        .iter()
        .map(|&(i, _)| Arc::clone(&locker.inner.nodes[i]))
        .collect();
    let results = on_all_nodes(&nodes, |node| {
        let fence_key = fence_key.to_owned();
        async move { node.raise_fence(&fence_key, fence, limit).await }
    })
    .await;
    nodes
        .iter()
        .zip(results)
        .filter_map(|(node, res)| res.err().map(|e| (node.addr().to_owned(), e.to_string())))
        .collect()
}

/// Undoes a failed attempt with compare-and-delete of `token` (a key that is not ours is left
/// alone). On the nodes that `granted` it: at once, and awaited for up to `limit` (a node that
/// stops answering then finishes in the background). On the `unsure` nodes (their request failed
/// but may have been applied) and on the nodes whose request is still in `late`: in the
/// background, each right after its reply, so that a late SET cannot outlive the attempt and the
/// caller does not wait for a node that may not answer.
async fn abandon(
    locker: &Locker,
    keys: &Keys,
    token: &str,
    granted: &[usize],
    unsure: Vec<usize>,
    mut late: Late,
    limit: Duration,
) {
    let release = {
        let (locker, keys, token) = (
            locker.clone(),
            Arc::new(keys.clone()),
            Arc::<str>::from(token),
        );
        move |i: usize| {
            let (locker, keys, token) = (locker.clone(), Arc::clone(&keys), Arc::clone(&token));
            async move { release_on(&locker, i, &keys, &token, 0).await }
        }
    };
    if !unsure.is_empty() || !late.is_empty() {
        let mut releases = JoinSet::new();
        for i in unsure {
            releases.spawn(release(i));
        }
        let release = release.clone();
        tokio::spawn(async move {
            while let Some(joined) = late.join_next().await {
                let Ok((i, reply)) = joined else { continue };
                if matches!(reply, Ok(AcquireReply::Taken { .. }) | Err(_)) {
                    releases.spawn(release(i));
                }
            }
            while releases.join_next().await.is_some() {}
        });
    }
    let mut releases = JoinSet::new();
    for &i in granted {
        releases.spawn(release(i));
    }
    let _ = tokio::time::timeout(limit, async {
        while releases.join_next().await.is_some() {}
    })
    .await;
    releases.detach_all();
}

/// Compare-and-delete (or shorten to `keep_ms`) `token` on node `i`; a failure is logged and
/// left to the key's ttl.
async fn release_on(locker: &Locker, i: usize, keys: &Keys, token: &str, keep_ms: u64) {
    let node = &locker.inner.nodes[i];
    if let Err(e) = node.release(&keys.key, token, keep_ms, &keys.channel).await {
        tracing::debug!(node = node.addr(), key = %keys.key, error = %e, "cleanup release failed; the key expires by its ttl");
    }
}

/// Follows the requests of a successful Redlock attempt that were still out when the majority
/// was reached. A late grant is part of the lease; but if the lease already ended, its release
/// may have reached that node before our SET did, so the key is released again there.
async fn settle_late_grants(locker: Locker, lease: Arc<LeaseShared>, mut late: Late) {
    while let Some(joined) = late.join_next().await {
        let Ok((i, reply)) = joined else { continue };
        if matches!(reply, Ok(AcquireReply::Taken { .. }) | Err(_)) && lease.is_ended() {
            let keys = Keys {
                key: lease.key.clone(),
                fence_key: String::new(),
                channel: lease.channel.clone(),
            };
            release_on(&locker, i, &keys, &lease.token, lease.keep_ms()).await;
        }
    }
}
