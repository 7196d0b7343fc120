//! [`SentinelSet`]: a private primary, its replicas and 3 sentinels per test.

mod builder;
mod config;
mod probe;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::Value;

pub use self::builder::SentinelSetBuilder;
use self::config::lift_restriction;
use self::probe::healthy_flags;
use super::admin::{self, replica_synced};
use super::proxy::FaultProxy;
use super::server::RedisServer;

/// Sentinels per set; a quorum of 2 is also their majority.
const SENTINELS: usize = 3;
/// Bound on start and restart.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on a failover: detection (1 s), agreement, election, promotion.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// Log lines of each node shown when something fails.
const LOG_LINES: usize = 25;

/// A primary, its replicas and 3 Redis Sentinels, private to a test, on free loopback ports.
///
/// Every process is a [`RedisServer`] (from `REDIS_SERVER_BIN`, else from `PATH`) with its own
/// directory; sentinels run `redis-server <dir>/sentinel.conf --sentinel`. The sentinels monitor
/// the primary with a quorum of 2, mark it down after 1 s without answers
/// (`down-after-milliseconds 1000`) and fail over within a few seconds
/// (`failover-timeout 3000`). No persistence.
///
/// With [`replica_via_proxy`](SentinelSetBuilder::replica_via_proxy), the replicas replicate
/// through a [`FaultProxy`] in front of the primary, so that a test can cut replication alone
/// (clients and sentinels still reach every node directly) and show what a failover loses.
///
/// Built with [`builder`](Self::builder) or [`start`](Self::start), both async (the proxy runs
/// on the tokio runtime). Waiting methods poll with short blocking checks and sleep on the
/// runtime between them. Dropping the set kills every process (`SIGKILL`, by pid, sentinels
/// first) and removes their directories.
///
/// ```no_run
/// use lock_testing::SentinelSet;
///
/// # async fn demo() {
/// let set = SentinelSet::start().await;
/// let (sentinels, master) = (set.sentinel_urls(), set.master_name()); // for a sentinel client
/// let old = set.primary().port;
///
/// set.kill_primary();
/// let new = set.wait_for_failover().await; // the replica, promoted
/// assert_ne!(new, old);
/// set.restart(old).await; // back, as a replica of `new`
/// # }
/// ```
pub struct SentinelSet {
    // Declared first so that they die first: no sentinel reacts to the data nodes dying.
    sentinels: Vec<RedisServer>,
    data: Vec<RedisServer>,
    proxy: Option<FaultProxy>,
    master_name: String,
    /// The primary as of the last wait (start or failover).
    primary: Mutex<u16>,
}

/// A primary or replica of a [`SentinelSet`], as the sentinels describe it at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MonitoredNode {
    /// Its port on `127.0.0.1`.
    pub port: u16,
    /// Pid of its current process.
    pub pid: u32,
}

impl MonitoredNode {
    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl SentinelSet {
    /// Options: number of replicas, replication through a proxy, master name.
    pub fn builder() -> SentinelSetBuilder {
        SentinelSetBuilder::default()
    }

    /// A primary, one replica and 3 sentinels: `SentinelSet::builder().start()`.
    ///
    /// # Panics
    ///
    /// As [`SentinelSetBuilder::start`].
    pub async fn start() -> SentinelSet {
        Self::builder().start().await
    }

    /// `redis://127.0.0.1:PORT` of each sentinel, for a sentinel-aware client.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The name the sentinels monitor the primary under.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The proxy the replicas replicate through, when built with
    /// [`replica_via_proxy(true)`](SentinelSetBuilder::replica_via_proxy).
    pub fn proxy(&self) -> Option<&FaultProxy> {
        self.proxy.as_ref()
    }

    /// The current primary, as the first running sentinel that answers reports it.
    ///
    /// # Panics
    ///
    /// If no sentinel answers.
    pub fn primary(&self) -> MonitoredNode {
        let port = self
            .ask_sentinels(|port| self.master_port(port))
            .unwrap_or_else(|e| panic!("SentinelSet::primary: {e}"));
        self.describe(port)
    }

    /// The running replicas the first running sentinel that answers considers healthy (not
    /// down, connected), sorted by port.
    ///
    /// # Panics
    ///
    /// If no sentinel answers.
    pub fn replicas(&self) -> Vec<MonitoredNode> {
        let listed = self
            .ask_sentinels(|port| self.sentinel_replicas(port))
            .unwrap_or_else(|e| panic!("SentinelSet::replicas: {e}"));
        let mut out: Vec<MonitoredNode> = listed
            .iter()
            .filter(|r| r.get("flags").is_some_and(|f| healthy_flags(f)))
            .filter_map(|r| r.get("port")?.parse().ok())
            .filter(|&port| self.data.iter().any(|s| s.port() == port && s.is_running()))
            .map(|port| self.describe(port))
            .collect();
        out.sort_by_key(|n| n.port);
        out
    }

    /// The process behind a data node or a sentinel, to pause, resume or inspect it.
    ///
    /// # Panics
    ///
    /// If `port` is not a node of this set.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.data
            .iter()
            .chain(&self.sentinels)
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("SentinelSet: no node on port {port}"))
    }

    /// Kills the current primary (as the sentinels report it) with `SIGKILL`; returns its port.
    /// The sentinels notice after 1 s; see [`wait_for_failover`](Self::wait_for_failover).
    pub fn kill_primary(&self) -> u16 {
        let port = self.primary().port;
        self.node(port).kill();
        port
    }

    /// Waits until every running sentinel reports a new primary (`SENTINEL
    /// get-master-addr-by-name`) and that node answers `ROLE` as a master; returns its port.
    /// Takes about 2–3 s after the primary dies. Other replicas are reconfigured to follow it
    /// by the sentinels, shortly after.
    ///
    /// # Panics
    ///
    /// If that does not happen within 30 s (with the logs).
    pub async fn wait_for_failover(&self) -> u16 {
        let old = *self.primary.lock().unwrap_or_else(PoisonError::into_inner);
        let new = self
            .wait("wait_for_failover", FAILOVER_TIMEOUT, || {
                let mut agreed = None;
                for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
                    let port = self.master_port(sentinel.port())?;
                    if port == old || agreed.is_some_and(|a| a != port) {
                        return Err(format!(
                            "sentinel {} reports {port} (old {old}, others {agreed:?})",
                            sentinel.port()
                        ));
                    }
                    agreed = Some(port);
                }
                let port = agreed.ok_or("no running sentinel")?;
                let role: Vec<Value> = admin::query(port, &["ROLE"])?;
                match role.first() {
                    Some(Value::BulkString(r)) if r == b"master" => Ok(port),
                    other => Err(format!("port {port}: ROLE {other:?}")),
                }
            })
            .await;
        *self.primary.lock().unwrap_or_else(PoisonError::into_inner) = new;
        if self.proxy.is_some() {
            self.follow_without_proxy(new);
        }
        new
    }

    /// Restarts a node (killing it first if it runs) on the same port and directory, and waits
    /// until it is back in its place. A sentinel: until it reports the current primary. A data
    /// node that is not the current primary (as the sentinels report it): it is made that
    /// primary's replica (`REPLICAOF`, as the sentinels would; through the proxy while the
    /// proxied primary is still the primary), and the wait lasts until it is synced and every
    /// running sentinel lists it as healthy. Its data is lost (no persistence).
    ///
    /// # Panics
    ///
    /// If `port` is not a node of this set, or it is not back within 20 s (with the logs).
    pub async fn restart(&self, port: u16) {
        self.node(port).restart();
        let primary = self.primary().port;
        if self.sentinels.iter().any(|s| s.port() == port) {
            self.wait("restart", START_TIMEOUT, || {
                match self.master_port(port)? {
                    p if p == primary => Ok(()),
                    p => Err(format!(
                        "sentinel {port} reports primary {p}, not {primary}"
                    )),
                }
            })
            .await;
            return;
        }
        if port == primary {
            // The original replicas were started as replicas: a primary comes back as one.
            if let Err(e) = admin::query::<()>(port, &["REPLICAOF", "NO", "ONE"]) {
                panic!("SentinelSet::restart: {e}");
            }
            return;
        }
        // Through the proxy while its primary lives, as the replicas were started.
        let target = match &self.proxy {
            Some(proxy) if proxy.upstream().port() == primary => proxy.addr().port(),
            _ => primary,
        }
        .to_string();
        if let Err(e) = admin::query::<()>(port, &["REPLICAOF", "127.0.0.1", &target]) {
            panic!("SentinelSet::restart: {e}");
        }
        self.wait("restart", START_TIMEOUT, || {
            replica_synced(port)?;
            for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
                let listed = self.sentinel_replicas(sentinel.port())?;
                let entry = listed
                    .iter()
                    .find(|r| r.get("port") == Some(&port.to_string()));
                if !entry
                    .and_then(|r| r.get("flags"))
                    .is_some_and(|f| healthy_flags(f))
                {
                    return Err(format!(
                        "sentinel {} lists {port} as {entry:?}",
                        sentinel.port()
                    ));
                }
            }
            Ok(())
        })
        .await;
    }

    /// After a failover in proxy mode: the sentinels may now reconfigure every replica, and the
    /// other replicas (still pointing at the proxy of a dead primary) follow the new primary.
    fn follow_without_proxy(&self, new: u16) {
        let target = new.to_string();
        for node in self.data.iter().filter(|s| s.is_running()) {
            let port = node.port();
            let _ = admin::query::<()>(port, &lift_restriction());
            if port != new {
                let _ = admin::query::<()>(port, &["REPLICAOF", "127.0.0.1", &target]);
            }
        }
    }
}

impl fmt::Debug for SentinelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelSet")
            .field("master_name", &self.master_name)
            .field("data", &self.data)
            .field("sentinels", &self.sentinels)
            .field("proxy", &self.proxy)
            .finish()
    }
}
