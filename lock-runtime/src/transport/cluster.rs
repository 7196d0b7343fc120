//! A Redis Cluster as one logical server: every key of one lock shares a hash tag, so each lock
//! lives in one slot and its scripts run on the primary of that slot. redis-rs's cluster client
//! routes each request by its key and follows MOVED, ASK and failovers; this module adds what a
//! lock engine needs on top: which primary serves which slots (to send one renewal call per
//! primary instead of one per lease), and every primary (for SCAN and start-up checks).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, RedisResult, Value};
use tokio::sync::{OnceCell, watch};
use tokio::time::Instant;

use crate::plumbing::unpoisoned::Unpoisoned;
use crate::transport::connect::{Settings, bounded};

/// A slot map older than this is fetched again before it groups a renewal round, even if no
/// request found it wrong: resharding moves slots without telling clients that do not touch them.
const SLOT_MAP_MAX_AGE: Duration = Duration::from_secs(5);

/// The cluster connection of one locker, and what it knows of the cluster's layout.
pub(crate) struct ClusterLink {
    client: ClusterClient,
    conn: Arc<OnceCell<ClusterConnection>>,
    /// The connection under way, if any: made in a task of its own, so that a caller that
    /// gives up (its attempt's bound, a dropped future) does not start it over next time.
    connecting: Mutex<Option<watch::Receiver<Option<RedisResult<()>>>>>,
    settings: Settings,
    slots: Mutex<Option<Arc<SlotMap>>>,
}

/// Which primary serves which slots, as `CLUSTER SLOTS` answered at one moment.
#[derive(Debug, Default)]
pub(crate) struct SlotMap {
    /// `(first slot, last slot, index into primaries)`, sorted by first slot.
    ranges: Vec<(u16, u16, usize)>,
    /// `(host, port)` of each primary that serves slots.
    pub(crate) primaries: Vec<(String, u16)>,
    fetched: Option<Instant>,
}

impl SlotMap {
    /// The primary (index into `primaries`) that serves `slot`, if any does.
    pub(crate) fn owner(&self, slot: u16) -> Option<usize> {
        let i = self.ranges.partition_point(|&(first, _, _)| first <= slot);
        let &(first, last, owner) = self.ranges.get(i.checked_sub(1)?)?;
        (first..=last).contains(&slot).then_some(owner)
    }

    /// The first slot that primary `i` serves.
    pub(crate) fn first_slot_of(&self, i: usize) -> Option<u16> {
        self.ranges
            .iter()
            .find(|&&(_, _, owner)| owner == i)
            .map(|&(first, _, _)| first)
    }

    /// Parses a `CLUSTER SLOTS` reply: `[first, last, [host, port, id, ..], replicas..]` per range.
    fn parse(reply: &Value) -> Option<Self> {
        let Value::Array(entries) = reply else {
            return None;
        };
        let mut map = Self::default();
        for entry in entries {
            let Value::Array(fields) = entry else {
                return None;
            };
            let int = |v: &Value| match v {
                Value::Int(n) => u16::try_from(*n).ok(),
                _ => None,
            };
            let (first, last) = (int(fields.first()?)?, int(fields.get(1)?)?);
            let Value::Array(primary) = fields.get(2)? else {
                return None;
            };
            let host = match primary.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let port = int(primary.get(1)?)?;
            let owner = match map
                .primaries
                .iter()
                .position(|p| p.0 == host && p.1 == port)
            {
                Some(i) => i,
                None => {
                    map.primaries.push((host, port));
                    map.primaries.len() - 1
                }
            };
            map.ranges.push((first, last, owner));
        }
        map.ranges.sort_unstable();
        Some(map)
    }
}

impl ClusterLink {
    /// Prepares the cluster client; nothing is sent until the first request.
    pub(crate) fn new(
        urls: &[String],
        settings: Settings,
        tls_root_cert: Option<&[u8]>,
    ) -> RedisResult<Self> {
        Ok(Self {
            client: client_builder(urls, settings, tls_root_cert).build()?,
            conn: Arc::new(OnceCell::new()),
            connecting: Mutex::new(None),
            settings,
            slots: Mutex::new(None),
        })
    }

    /// The cluster connection, made on first use (it learns the slots from the seed nodes).
    pub(crate) async fn conn(&self) -> RedisResult<ClusterConnection> {
        if let Some(conn) = self.conn.get() {
            return Ok(conn.clone());
        }
        let mut done = {
            let mut connecting = self.connecting.locked();
            match connecting.as_ref() {
                // Under way: wait for it.
                Some(rx) if rx.borrow().is_none() => rx.clone(),
                // Never tried, or the last try failed: try (again).
                _ => {
                    let (tx, rx) = watch::channel(None);
                    let (client, cell) = (self.client.clone(), Arc::clone(&self.conn));
                    let limit = self.settings.connect_timeout + self.settings.response_timeout;
                    tokio::spawn(async move {
                        let made = bounded(limit, client.get_async_connection()).await;
                        let outcome = made.map(|conn| {
                            let _ = cell.set(conn);
                        });
                        let _ = tx.send(Some(outcome));
                    });
                    *connecting = Some(rx.clone());
                    rx
                }
            }
        };
        let outcome = done
            .wait_for(Option::is_some)
            .await
            .map_err(|_| {
                redis::RedisError::from((ErrorKind::Io, "the cluster connection task ended"))
            })?
            .clone()
            .expect("waited for Some");
        outcome?;
        Ok(self.conn.get().expect("set before the outcome").clone())
    }

    /// The current slot map: the one fetched last, unless a request found it wrong or it is
    /// older than a few seconds.
    pub(crate) async fn slot_map(&self) -> RedisResult<Arc<SlotMap>> {
        if let Some(map) = self.slots.locked().clone()
            && map
                .fetched
                .is_some_and(|at| at.elapsed() < SLOT_MAP_MAX_AGE)
        {
            return Ok(map);
        }
        let mut conn = self.conn().await?;
        let reply = bounded(
            self.settings.response_timeout,
            conn.route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            ),
        )
        .await?;
        let mut map = SlotMap::parse(&reply).ok_or_else(|| {
            redis::RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "CLUSTER SLOTS reply not understood",
            ))
        })?;
        map.fetched = Some(Instant::now());
        let map = Arc::new(map);
        *self.slots.locked() = Some(Arc::clone(&map));
        Ok(map)
    }

    /// A request found a key on another primary than the map said: fetch the map again.
    pub(crate) fn slot_map_is_stale(&self) {
        *self.slots.locked() = None;
    }

    /// Sends `command` to every primary, each bounded by `limit`; returns each primary's
    /// `host:port` and reply.
    pub(crate) async fn each_primary(
        &self,
        command: &redis::Cmd,
        limit: Duration,
    ) -> RedisResult<Vec<(String, Value)>> {
        let map = self.slot_map().await?;
        let mut conn = self.conn().await?;
        let mut out = Vec::with_capacity(map.primaries.len());
        for (i, (host, port)) in map.primaries.iter().enumerate() {
            let slot = map.first_slot_of(i).unwrap_or(0);
            let route = RoutingInfo::SingleNode(route_to_slot(slot));
            let reply = bounded(limit, conn.route_command(command.clone(), route)).await?;
            out.push((format!("{host}:{port}"), reply));
        }
        Ok(out)
    }
}

/// The cluster client of a locker's commands, or (with `push`) of its release notifications.
pub(crate) fn client_builder(
    urls: &[String],
    settings: Settings,
    tls_root_cert: Option<&[u8]>,
) -> ClusterClientBuilder {
    let builder = ClusterClient::builder(urls.iter().map(String::as_str))
        .connection_timeout(settings.connect_timeout)
        .response_timeout(settings.response_timeout)
        .retries(4)
        .min_retry_wait(20)
        .max_retry_wait(500);
    #[cfg(feature = "tls")]
    if let Some(root) = tls_root_cert {
        return builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root.to_vec()),
        });
    }
    #[cfg(not(feature = "tls"))]
    let _ = tls_root_cert;
    builder
}

/// The route to the primary that serves `slot`, as the cluster client knows it.
pub(crate) fn route_to_slot(slot: u16) -> SingleNodeRoutingInfo {
    use redis::cluster_routing::{Route, SlotAddr};
    SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn slot_map_parses_cluster_slots_and_finds_owners() {
        let range = |first: i64, last: i64, port: i64| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(port + 100), bulk("r")]),
            ])
        };
        let reply = Value::Array(vec![
            range(5461, 10922, 7001),
            range(0, 5460, 7000),
            range(10923, 16000, 7002),
            range(16001, 16383, 7000),
        ]);
        let map = SlotMap::parse(&reply).unwrap();
        assert_eq!(map.primaries.len(), 3);
        let port = |slot| map.owner(slot).map(|i| map.primaries[i].1);
        assert_eq!(port(0), Some(7000));
        assert_eq!(port(5460), Some(7000));
        assert_eq!(port(5461), Some(7001));
        assert_eq!(port(16000), Some(7002));
        assert_eq!(port(16383), Some(7000));
        // A slot nobody serves (mid-failover) has no owner.
        let gap = SlotMap::parse(&Value::Array(vec![range(10, 20, 7000)])).unwrap();
        assert_eq!(gap.owner(5), None);
        assert_eq!(gap.owner(21), None);
        assert_eq!(gap.owner(15), Some(0));
        assert!(SlotMap::parse(&Value::Int(1)).is_none());
    }
}
