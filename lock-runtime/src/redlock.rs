//! Redlock: one lock over N independent nodes, held with a majority of the configured N.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::acquire::Attempt;
use crate::fanout::on_all_nodes;
use crate::keys::Keys;
use crate::lease::LeaseShared;
use crate::node::{AcquireReply, AcquireRequest, Node};

/// Fence floor granularity on a Redlock node: the server's clock rounded down to the second, so
/// that the nodes of a majority hand out the same fence and need no second round trip to agree.
const REDLOCK_FENCE_QUANTUM_US: u64 = 1_000_000;
use crate::{LockError, Locker};

/// Acquire requests still out when an attempt was decided: `(node index, reply)`.
pub(crate) type Late = JoinSet<(usize, redis::RedisResult<AcquireReply>)>;

/// A lock granted by one node, or by a majority.
pub(crate) struct Grant {
    pub(crate) fence: u64,
    /// The nodes that granted it before the attempt was decided.
    pub(crate) nodes: Vec<usize>,
    /// Requests to the other nodes, still out.
    pub(crate) late: Late,
}

/// Redlock: ask every node at once; the lock holds with `N/2 + 1` grants of the configured N.
/// Returns the grant, or the busy outcome; a majority out of reach is `QuorumUnavailable`.
/// Decides as soon as a majority granted or is out of reach; a failed attempt deletes what it
/// took before it returns (and on the nodes still out, as soon as they answer).
pub(crate) async fn redlock_attempt(
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
    let retention_ms = locker.fence_retention_ms();
    for (i, node) in nodes.iter().enumerate() {
        let node = Arc::clone(node);
        let (keys, token) = (keys.clone(), token.to_owned());
        let limit = node.response_timeout().min(per_node);
        set.spawn(async move {
            let request = AcquireRequest {
                token: &token,
                ttl_ms,
                // No waiter queue on Redlock: nodes could disagree on who is first.
                waiter: None,
                evict: None,
                fence_quantum: REDLOCK_FENCE_QUANTUM_US,
                fence_retention_ms: retention_ms,
                limit,
            };
            (i, node.acquire(&keys, &request).await)
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
            // Not sent on Redlock (no queue); counted as busy all the same.
            Ok(AcquireReply::NotOurTurn { .. }) => busy_nodes.push(i),
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
        // Only counters behind the maximum need raising; when the nodes are in step (the usual
        // case) that is none, and the acquire stays one round trip.
        let behind: Vec<(usize, u64)> = granted
            .iter()
            .copied()
            .filter(|&(_, f)| f < fence)
            .collect();
        let raise_failures = if behind.is_empty() {
            Vec::new()
        } else {
            raise_fences(locker, &behind, &keys.fence_key, fence, per_node).await
        };
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
pub(crate) async fn raise_fences(
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
    let retention_ms = locker.fence_retention_ms();
    let results = on_all_nodes(&nodes, |node| {
        let fence_key = fence_key.to_owned();
        async move {
            node.raise_fence(&fence_key, fence, retention_ms, limit)
                .await
        }
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
pub(crate) async fn abandon(
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
pub(crate) async fn release_on(locker: &Locker, i: usize, keys: &Keys, token: &str, keep_ms: u64) {
    let node = &locker.inner.nodes[i];
    if let Err(e) = node.release(&keys.key, token, keep_ms, &keys.channel).await {
        tracing::debug!(node = node.addr(), key = %keys.key, error = %e, "cleanup release failed; the key expires by its ttl");
    }
}

/// Follows the requests of a successful Redlock attempt that were still out when the majority
/// was reached. A late grant is part of the lease; but if the lease already ended, its release
/// may have reached that node before our SET did, so the key is released again there.
pub(crate) async fn settle_late_grants(locker: Locker, lease: Arc<LeaseShared>, mut late: Late) {
    while let Some(joined) = late.join_next().await {
        let Ok((i, reply)) = joined else { continue };
        if matches!(reply, Ok(AcquireReply::Taken { .. }) | Err(_)) && lease.is_ended() {
            let keys = Keys::new(lease.key.clone());
            release_on(&locker, i, &keys, &lease.token, lease.keep_ms()).await;
        }
    }
}
