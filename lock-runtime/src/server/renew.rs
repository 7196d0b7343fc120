//! Renewal on one server: one script call per chunk of leases, and on a Redis Cluster one
//! pipeline per primary, whatever the slots the leases spread over.

use std::sync::atomic::Ordering;

use redis::{FromRedisValue, RedisError, RedisResult, ServerErrorKind, Value};
use tokio::time::Instant;

use super::Node;
use super::calls::{self, Call};
use super::replies::Renewal;
use crate::server::scripts;
use crate::transport::cluster::ClusterLink;
use crate::transport::connect::bounded;

/// What one server said of one lease in a renewal round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewReply {
    Renewed,
    NotOwner,
    /// Renewed on the primary, but fewer replicas than asked acknowledged it in time.
    NotReplicated,
}

/// One server's answer to a renewal of many leases.
pub(crate) struct RenewReplies {
    /// One per lease, in order; `None` where no reply came.
    pub replies: Vec<Option<RenewReply>>,
    /// The last error of a call that failed (its leases have no reply).
    pub error: Option<RedisError>,
}

/// Most leases in one renewal script call.
pub(crate) const RENEW_CHUNK: usize = 1000;

impl Node {
    /// Renews many leases: `(key, token, ttl_ms)` each; one reply per lease, `None` where no
    /// answer came. One script call per chunk of up to [`RENEW_CHUNK`] leases; on a Redis Cluster,
    /// one per primary and chunk (see [`Self::renew_on_cluster`]). Replicas asked for by
    /// `replicas(n)` must acknowledge the call, else every lease it renewed is `NotReplicated`.
    /// Each reply is a sample of the round trip: the watchdog renews more often on a slow link.
    pub(crate) async fn renew(&self, items: &[(&str, &str, u64)]) -> RenewReplies {
        if let Some(cluster) = self.link.cluster() {
            return self.renew_on_cluster(cluster, items).await;
        }
        let sent = Instant::now();
        match self.renew_call(items).await {
            Ok(replies) => {
                self.rtt.record(sent.elapsed());
                RenewReplies {
                    replies,
                    error: None,
                }
            }
            Err(e) => {
                tracing::debug!(target: "lock_runtime::hold", node = %self.addr, error = %e, leases = items.len(), "renewal failed; retrying");
                RenewReplies {
                    replies: vec![None; items.len()],
                    error: Some(e),
                }
            }
        }
    }

    /// One [`scripts::RENEW`] call (keys declared, so that it is routed by them).
    async fn renew_call(
        &self,
        items: &[(&str, &str, u64)],
    ) -> RedisResult<Vec<Option<RenewReply>>> {
        let cmd = calls::Renew { items }.command();
        let wait = self.wait_cmd(min_ttl(items), self.settings.response_timeout);
        let limit = self.settings.response_timeout;
        let (codes, acked): (Vec<Renewal>, Option<usize>) =
            if self.renew_loaded.load(Ordering::Relaxed) || self.is_cluster() {
                self.eval(&scripts::RENEW, &cmd, wait.as_ref(), limit)
                    .await?
            } else {
                let out = self.load_and_renew(cmd, wait, limit).await?;
                self.renew_loaded.store(true, Ordering::Relaxed);
                out
            };
        Ok(self.renew_replies(codes, acked))
    }

    /// The first renewal on this server: `SCRIPT LOAD` ahead of `renew` in one pipeline, so that
    /// it takes one round trip where a server without the script takes three (NOSCRIPT, the
    /// load, the call again): on a slow link that could be too late for a short lease.
    async fn load_and_renew(
        &self,
        renew: redis::Cmd,
        wait: Option<redis::Cmd>,
        limit: std::time::Duration,
    ) -> RedisResult<(Vec<Renewal>, Option<usize>)> {
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.cmd("SCRIPT")
            .arg("LOAD")
            .arg(scripts::RENEW_CODE)
            .ignore();
        pipe.add_command(renew);
        let waits = wait.is_some();
        if let Some(wait) = wait {
            pipe.add_command(wait);
        }
        let mut conn = self.conn().await?;
        self.bounded(limit, async {
            if waits {
                let (codes, acked) = pipe.query_async::<(Vec<Renewal>, usize)>(&mut conn).await?;
                Ok((codes, Some(acked)))
            } else {
                let (codes,) = pipe.query_async::<(Vec<Renewal>,)>(&mut conn).await?;
                Ok((codes, None))
            }
        })
        .await
    }

    /// Renewal outcomes as replies; a renewal that the replicas did not acknowledge is
    /// `NotReplicated`, one not served here has no reply.
    fn renew_replies(&self, codes: Vec<Renewal>, acked: Option<usize>) -> Vec<Option<RenewReply>> {
        let replicated = acked.is_none_or(|n| n >= self.replicas);
        codes
            .into_iter()
            .map(|code| match code {
                Renewal::Renewed if replicated => Some(RenewReply::Renewed),
                Renewal::Renewed => Some(RenewReply::NotReplicated),
                Renewal::NotOurs => Some(RenewReply::NotOwner),
                Renewal::Elsewhere => None,
            })
            .collect()
    }

    /// Renewal on a Redis Cluster: the leases grouped by the primary that serves their slot (the
    /// slot map), one [`scripts::RENEW_ANY_SLOT`] call per primary and chunk, all at once, so a
    /// round costs about one call per primary however the leases spread over the slots. A lease
    /// that primary no longer serves (a resharding or a failover moved its slot) is sent again
    /// on its own, routed by its key, which follows MOVED and ASK; the slot map is then fetched
    /// again.
    async fn renew_on_cluster(
        &self,
        cluster: &ClusterLink,
        items: &[(&str, &str, u64)],
    ) -> RenewReplies {
        let sent = Instant::now();
        let groups: Vec<(u16, Vec<usize>)> = match cluster.slot_map().await {
            Ok(map) => {
                let mut by_owner: Vec<(u16, Vec<usize>)> = Vec::new();
                let mut index: std::collections::HashMap<usize, usize> = Default::default();
                for (i, (key, _, _)) in items.iter().enumerate() {
                    let slot = crate::transport::slot::key_slot(key.as_bytes());
                    let owner = map.owner(slot).unwrap_or(usize::MAX);
                    let at = *index.entry(owner).or_insert_with(|| {
                        by_owner.push((slot, Vec::new()));
                        by_owner.len() - 1
                    });
                    by_owner[at].1.push(i);
                }
                by_owner
            }
            // No map: send everything to one primary; what it does not serve comes back below.
            Err(_) => vec![(
                crate::transport::slot::key_slot(
                    items.first().map_or(&b""[..], |i| i.0.as_bytes()),
                ),
                (0..items.len()).collect(),
            )],
        };
        let results =
            crate::plumbing::fanout::join_all_values(groups.iter().map(|(slot, members)| {
                let group: Vec<(&str, &str, u64)> = members.iter().map(|&i| items[i]).collect();
                async move {
                    let replies = self.renew_on_primary(cluster, *slot, &group).await;
                    (members.as_slice(), replies)
                }
            }))
            .await;
        let mut out: Vec<Option<RenewReply>> = vec![None; items.len()];
        let mut error = None;
        let mut elsewhere: Vec<usize> = Vec::new();
        for (chunk, result) in results {
            match result {
                Ok(codes) => {
                    self.rtt.record(sent.elapsed());
                    for (&i, code) in chunk.iter().zip(codes) {
                        match code {
                            Some(reply) => out[i] = Some(reply),
                            None => elsewhere.push(i),
                        }
                    }
                }
                Err(e) => {
                    // Perhaps a failover: learn the slots again before the retry.
                    cluster.slot_map_is_stale();
                    tracing::debug!(target: "lock_runtime::hold", node = %self.addr, error = %e, leases = chunk.len(), "renewal on a cluster primary failed; retrying");
                    error = Some(e);
                }
            }
        }
        if !elsewhere.is_empty() {
            cluster.slot_map_is_stale();
            let resent = crate::plumbing::fanout::join_all_values(elsewhere.iter().map(|&i| {
                let item = [items[i]];
                async move { (i, self.renew_call(&item).await) }
            }))
            .await;
            for (i, result) in resent {
                match result {
                    Ok(codes) => out[i] = codes.into_iter().next().flatten(),
                    Err(e) => error = Some(e),
                }
            }
        }
        RenewReplies {
            replies: out,
            error,
        }
    }

    /// One pipeline to the cluster primary that serves `slot`: a [`scripts::RENEW_ANY_SLOT`]
    /// call per chunk of [`RENEW_CHUNK`] leases, then `WAIT` when replicas must acknowledge.
    /// A lease that primary does not serve comes back `None`.
    async fn renew_on_primary(
        &self,
        cluster: &ClusterLink,
        slot: u16,
        items: &[(&str, &str, u64)],
    ) -> RedisResult<Vec<Option<RenewReply>>> {
        let script = &scripts::RENEW_ANY_SLOT;
        let mut pipe = redis::Pipeline::with_capacity(items.len() / RENEW_CHUNK + 2);
        for chunk in items.chunks(RENEW_CHUNK) {
            pipe.add_command(calls::RenewAnySlot { items: chunk }.command());
        }
        let calls = items.chunks(RENEW_CHUNK).len();
        let wait = self.wait_cmd(min_ttl(items), self.settings.response_timeout);
        if let Some(wait) = wait.clone() {
            pipe.add_command(wait);
        }
        let count = calls + usize::from(wait.is_some());
        let route = crate::transport::cluster::route_to_slot(slot);
        let mut conn = cluster.conn().await?;
        let call = async {
            let mut loaded = false;
            loop {
                let replies = conn
                    .route_pipeline(pipe.clone(), 0, count, route.clone())
                    .await?;
                let noscript = replies.iter().any(|r| {
                    matches!(r, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
                });
                if noscript && !loaded {
                    script.prepare_invoke().load_async(&mut conn).await?;
                    loaded = true;
                    continue;
                }
                return Ok(replies);
            }
        };
        let mut replies = bounded(self.settings.response_timeout, call)
            .await?
            .into_iter();
        let mut codes: Vec<Renewal> = Vec::with_capacity(items.len());
        for _ in 0..calls {
            let reply = replies.next().unwrap_or(Value::Nil).extract_error()?;
            codes.extend(Vec::<Renewal>::from_redis_value(reply)?);
        }
        let acked = match wait {
            Some(_) => Some(usize::from_redis_value(
                replies.next().unwrap_or(Value::Nil).extract_error()?,
            )?),
            None => None,
        };
        Ok(self.renew_replies(codes, acked))
    }
}

/// The shortest ttl of a batch of renewals: the one whose margin bounds its `WAIT`.
fn min_ttl(items: &[(&str, &str, u64)]) -> u64 {
    items.iter().map(|i| i.2).min().unwrap_or(0)
}
