//! [`RedisCluster`]: a private Redis Cluster (3 primaries, 3 replicas) per test.

mod reshard;
mod spawn;
#[cfg(test)]
mod tests;
mod topology;

use std::fmt;
use std::ops::RangeInclusive;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use self::spawn::{cli_bin, create, logs, node_args};
use self::topology::{View, check_settled, view_of};
use super::admin::{self, poll};
use super::server::{NodeSpec, RedisServer, make_temp_dir, server_bin};
use super::slot::key_slot;

/// Primaries, each with one replica.
const PRIMARIES: usize = 3;
/// Bound on waiting for the cluster to settle after start, restart or reshard.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on a failover: detection, election, then settling.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// A Redis Cluster of 3 primaries and 3 replicas, private to a test, on free loopback ports.
///
/// Each node is a [`RedisServer`] (from `REDIS_SERVER_BIN`, else from `PATH`) with cluster mode
/// on, its own directory and `nodes.conf`, its own cluster bus port, a 1 s
/// `cluster-node-timeout` (a failover takes about 3 s) and no persistence. The cluster is created
/// with `redis-cli --cluster create` (`redis-cli` next to `REDIS_SERVER_BIN`, else from `PATH`).
/// Replica migration is off (`cluster-allow-replica-migration no`), so the topology changes only
/// through the methods below and failovers.
///
/// The waiting methods ([`start`](Self::start), [`wait_for_failover`](Self::wait_for_failover),
/// [`reshard`](Self::reshard), [`restart`](Self::restart), [`wait_settled`](Self::wait_settled))
/// block the calling thread for up to a few seconds and panic with the nodes' logs if the
/// cluster does not get there in time. They work inside or outside a tokio runtime; with clients
/// running on the same current-thread runtime meanwhile, call them through
/// `tokio::task::spawn_blocking` (the cluster is `Send + Sync`, share it in an `Arc`).
///
/// Dropping it kills every node (`SIGKILL`, by pid) and removes their directories.
///
/// ```no_run
/// use lock_testing::RedisCluster;
///
/// let cluster = RedisCluster::start();
/// let seeds = cluster.urls(); // give these to a cluster client
/// let owner = cluster.primary_for_key("lock:{invoice:42}");
///
/// cluster.kill(owner.port);
/// let new_port = cluster.wait_for_failover(owner.port); // its replica, promoted
/// assert_eq!(cluster.primary_for_key("lock:{invoice:42}").port, new_port);
///
/// cluster.reshard(0..100, new_port); // slots 0..=99 now served by `new_port`
/// cluster.restart(owner.port); // rejoins, as a replica of `new_port`
/// ```
pub struct RedisCluster {
    nodes: Vec<Node>,
    /// The last settled view: which replica belonged to which primary before a failover.
    settled: Mutex<View>,
}

struct Node {
    server: RedisServer,
    /// Cluster node id, kept across restarts (in `nodes.conf`).
    id: String,
}

/// A node of a [`RedisCluster`], as the cluster describes it at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterNode {
    /// Its port on `127.0.0.1`.
    pub port: u16,
    /// Pid of its current process.
    pub pid: u32,
    /// The cluster node id.
    pub id: String,
    /// The hash slots it serves, as sorted inclusive ranges (empty for a replica).
    pub slots: Vec<RangeInclusive<u16>>,
    /// For a replica, the port of its primary.
    pub primary: Option<u16>,
}

impl ClusterNode {
    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl RedisCluster {
    /// Starts 6 nodes, creates the cluster (3 primaries, each with 1 replica), and returns once
    /// it is settled: every node reports `cluster_state:ok` with all 16384 slots served, all
    /// nodes agree on the topology, and every replica is synced with its primary. Takes about
    /// 2 s.
    ///
    /// # Panics
    ///
    /// If `redis-server` or `redis-cli` cannot be found, or the cluster does not settle within
    /// 20 s (with the nodes' logs).
    #[must_use = "dropping the RedisCluster kills its nodes"]
    pub fn start() -> RedisCluster {
        let cli = cli_bin();
        let bin = server_bin();
        let servers: Vec<RedisServer> = (0..PRIMARIES * 2)
            .map(|_| {
                RedisServer::launch_node(NodeSpec {
                    bin: bin.clone(),
                    dir: make_temp_dir(),
                    conf_file: None,
                    sentinel: false,
                    cluster_bus: true,
                    args: node_args(),
                    env: Vec::new(),
                })
            })
            .collect();
        if let Err(e) = create(&cli, &servers) {
            panic!("RedisCluster::start: {e}\n{}", logs(&servers));
        }
        let ids: Result<Vec<String>, String> = servers
            .iter()
            .map(|s| admin::query(s.port(), &["CLUSTER", "MYID"]))
            .collect();
        let ids = ids.unwrap_or_else(|e| panic!("RedisCluster::start: {e}\n{}", logs(&servers)));
        let cluster = RedisCluster {
            nodes: servers
                .into_iter()
                .zip(ids)
                .map(|(server, id)| Node { server, id })
                .collect(),
            settled: Mutex::new(View::default()),
        };
        cluster.settle("start", SETTLE_TIMEOUT, &[], |_| Ok(()));
        cluster
    }

    /// `redis://127.0.0.1:PORT` of every node (primaries and replicas), to seed a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.server.url()).collect()
    }

    /// The ports of every node.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.server.port()).collect()
    }

    /// The server behind one node, to pause, resume or inspect it (e.g. its log).
    ///
    /// # Panics
    ///
    /// If `port` is not a node of this cluster.
    pub fn node(&self, port: u16) -> &RedisServer {
        &self.find(port).server
    }

    /// The running primaries, as the first running node that answers describes them now,
    /// sorted by their first slot.
    ///
    /// After a fault, call a waiting method first for a settled answer.
    pub fn primaries(&self) -> Vec<ClusterNode> {
        let view = self.current_view();
        let mut nodes = self.describe(&view, |e| e.primary);
        nodes.sort_by_key(|n| n.slots.first().map_or(u32::MAX, |r| u32::from(*r.start())));
        nodes
    }

    /// The running replicas, as the first running node that answers describes them now,
    /// sorted by port.
    pub fn replicas(&self) -> Vec<ClusterNode> {
        let view = self.current_view();
        self.describe(&view, |e| !e.primary)
    }

    /// The primary serving hash slot `slot` (`0..16384`) now.
    ///
    /// # Panics
    ///
    /// If no healthy primary serves it (e.g. during a failover).
    pub fn node_for_slot(&self, slot: u16) -> ClusterNode {
        let view = self.current_view();
        let owner = view.owner(slot).unwrap_or_else(|| {
            panic!("RedisCluster: no healthy primary serves slot {slot}: {view}")
        });
        let port = owner.port;
        self.describe(&view, |e| e.port == port)
            .pop()
            .unwrap_or_else(|| panic!("RedisCluster: the owner of slot {slot} is not running"))
    }

    /// The primary serving `key` now: the node of [`key_slot`](super::key_slot)`(key)`,
    /// hash tags included.
    pub fn primary_for_key(&self, key: impl AsRef<[u8]>) -> ClusterNode {
        self.node_for_slot(key_slot(key.as_ref()))
    }

    /// Kills one node with `SIGKILL` and returns at once; the cluster notices after about a
    /// second (`cluster-node-timeout`). See [`wait_for_failover`](Self::wait_for_failover).
    ///
    /// # Panics
    ///
    /// If `port` is not a node of this cluster.
    pub fn kill(&self, port: u16) {
        self.find(port).server.kill();
    }

    /// Waits until a replica of the primary on `old_primary_port` (killed or paused) has been
    /// promoted, and the other nodes are settled again (all ok, in agreement, replicas synced);
    /// returns the new primary's port. Takes about 3 s after the kill.
    ///
    /// # Panics
    ///
    /// If `old_primary_port` had no replica at the last settled point, or the failover does not
    /// complete within 30 s (with the nodes' logs).
    pub fn wait_for_failover(&self, old_primary_port: u16) -> u16 {
        let old_id = self.find(old_primary_port).id.clone();
        let candidates: Vec<String> = self
            .settled_view()
            .entries
            .iter()
            .filter(|e| e.primary_id.as_deref() == Some(old_id.as_str()))
            .map(|e| e.id.clone())
            .collect();
        assert!(
            !candidates.is_empty(),
            "RedisCluster::wait_for_failover: port {old_primary_port} was not a primary with a \
             replica: {}",
            self.settled_view()
        );
        let view = self.settle(
            "wait_for_failover",
            FAILOVER_TIMEOUT,
            &[old_primary_port],
            |view| {
                if view
                    .by_id(&old_id)
                    .is_some_and(|old| old.primary && !old.failed)
                {
                    return Err(format!(
                        "port {old_primary_port} is still a healthy primary"
                    ));
                }
                let promoted = view
                    .entries
                    .iter()
                    .any(|e| candidates.contains(&e.id) && e.primary && !e.slots.is_empty());
                if promoted {
                    Ok(())
                } else {
                    Err(format!(
                        "no replica of port {old_primary_port} promoted yet"
                    ))
                }
            },
        );
        view.entries
            .iter()
            .find(|e| candidates.contains(&e.id) && e.primary && !e.slots.is_empty())
            .map(|e| e.port)
            .expect("checked by the settle condition")
    }

    /// Restarts one node (killing it first if it runs) on the same port, bus port and directory,
    /// so that it rejoins with its `nodes.conf` (a former primary whose replica took over comes
    /// back as that replica's replica); returns once the cluster is settled with it. Its data is
    /// lost (no persistence) and resynced from its primary.
    ///
    /// # Panics
    ///
    /// If `port` is not a node of this cluster, or the cluster does not settle within 20 s.
    pub fn restart(&self, port: u16) {
        self.find(port).server.restart();
        self.settle("restart", SETTLE_TIMEOUT, &[], |_| Ok(()));
    }

    /// Waits until the running nodes are settled: each reports `cluster_state:ok` with all
    /// 16384 slots served, all agree on the topology, every running replica is synced.
    ///
    /// # Panics
    ///
    /// If that takes more than 20 s (with the nodes' logs).
    pub fn wait_settled(&self) {
        self.settle("wait_settled", SETTLE_TIMEOUT, &[], |_| Ok(()));
    }

    fn find(&self, port: u16) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.server.port() == port)
            .unwrap_or_else(|| {
                panic!(
                    "RedisCluster: no node on port {port} (nodes: {:?})",
                    self.ports()
                )
            })
    }

    fn settled_view(&self) -> View {
        self.settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Polls until the running nodes but `exclude` are settled and `done(view)` holds; records
    /// and returns the view. Panics with the logs on timeout.
    fn settle(
        &self,
        what: &str,
        timeout: Duration,
        exclude: &[u16],
        done: impl Fn(&View) -> Result<(), String>,
    ) -> View {
        let result = poll(timeout, || {
            let live: Vec<(u16, &str)> = self
                .nodes
                .iter()
                .filter(|n| n.server.is_running() && !exclude.contains(&n.server.port()))
                .map(|n| (n.server.port(), n.id.as_str()))
                .collect();
            let view = check_settled(&live)?;
            done(&view)?;
            Ok(view)
        });
        match result {
            Ok(view) => {
                *self.settled.lock().unwrap_or_else(PoisonError::into_inner) = view.clone();
                view
            }
            Err(e) => panic!(
                "RedisCluster::{what}: cluster not settled: {e}\n{}",
                self.logs()
            ),
        }
    }

    /// The view of the first running node that answers.
    fn current_view(&self) -> View {
        let mut errors = Vec::new();
        for node in self.nodes.iter().filter(|n| n.server.is_running()) {
            match view_of(node.server.port()) {
                Ok(view) => return view,
                Err(e) => errors.push(e),
            }
        }
        panic!("RedisCluster: no running node answered CLUSTER NODES: {errors:?}");
    }

    /// The running nodes of `view` that match `keep`, sorted by port.
    fn describe(&self, view: &View, keep: impl Fn(&topology::Entry) -> bool) -> Vec<ClusterNode> {
        let mut out: Vec<ClusterNode> = view
            .entries
            .iter()
            .filter(|e| !e.failed && keep(e))
            .filter_map(|e| {
                let node = self.nodes.iter().find(|n| n.id == e.id)?;
                node.server.is_running().then(|| ClusterNode {
                    port: e.port,
                    pid: node.server.pid(),
                    id: e.id.clone(),
                    slots: e.slots.clone(),
                    primary: e
                        .primary_id
                        .as_deref()
                        .and_then(|p| view.by_id(p))
                        .map(|p| p.port),
                })
            })
            .collect();
        out.sort_by_key(|n| n.port);
        out
    }

    fn logs(&self) -> String {
        let servers: Vec<&RedisServer> = self.nodes.iter().map(|n| &n.server).collect();
        logs(&servers)
    }
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field(
                "nodes",
                &self.nodes.iter().map(|n| &n.server).collect::<Vec<_>>(),
            )
            .finish()
    }
}
