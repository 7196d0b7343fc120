//! The kinds of deployment a behaviour runs on, each started once per test process and shared
//! by the cases, and what a case needs of it: lockers of that kind, and where a lock's keys are.
//!
//! A Cluster or a Sentinel set takes seconds to start, so each kind's servers start on the first
//! case that asks for them and serve every later case of the process; each case gets a key
//! prefix of its own, so that cases running at the same time never share a lock. The servers
//! stop when the process exits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};

use lock_runtime::{Locker, LockerBuilder};
use lock_testing::{RedisCluster, RedisServer, SentinelSet};
use redis::aio::MultiplexedConnection;

use super::{exists, query, raw_connection, raw_connection_to};

/// A kind of deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One redis-server.
    Standalone,
    /// A Redis Cluster of 3 primaries and 3 replicas.
    Cluster,
    /// A primary, a replica and 3 Sentinels; lockers wait for the replica (`replicas(1)`).
    Sentinel,
    /// Redlock over 3 independent servers.
    Redlock,
    /// `Locker::in_memory()`: no server; the case's lockers are clones of one.
    InMemory,
}

impl Kind {
    /// The kind a case table names in lower case (`standalone`, `cluster`, ...).
    pub fn named(name: &str) -> Self {
        match name {
            "standalone" => Self::Standalone,
            "cluster" => Self::Cluster,
            "sentinel" => Self::Sentinel,
            "redlock" => Self::Redlock,
            "in_memory" => Self::InMemory,
            other => panic!("no deployment kind `{other}`"),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The running servers of one kind.
enum Servers {
    Standalone(RedisServer),
    Cluster(RedisCluster),
    Sentinel(SentinelSet),
    Redlock(Vec<RedisServer>),
    InMemory,
}

impl Servers {
    fn start(kind: Kind) -> Self {
        match kind {
            Kind::Standalone => Self::Standalone(RedisServer::start()),
            Kind::Cluster => Self::Cluster(RedisCluster::start()),
            // Started on a runtime of its own: the set keeps nothing that needs it afterwards
            // (no proxy), so it outlives the case that started it.
            Kind::Sentinel => Self::Sentinel(
                std::thread::spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(SentinelSet::start())
                })
                .join()
                .expect("the Sentinel set starts"),
            ),
            Kind::Redlock => Self::Redlock((0..3).map(|_| RedisServer::start()).collect()),
            Kind::InMemory => Self::InMemory,
        }
    }
}

/// Each kind's servers, once started. Held here until the process exits; a lock per kind, so
/// that kinds start at the same time.
static RUNNING: [Mutex<Option<Arc<Servers>>>; 5] = [const { Mutex::new(None) }; 5];

/// Makes the prefixes of the cases unique within the process.
static CASES: AtomicUsize = AtomicUsize::new(0);

/// Stops every kind's servers: the statics are never dropped, so the process exit does it.
extern "C" fn stop_all() {
    for kind in &RUNNING {
        if let Ok(mut servers) = kind.lock() {
            drop(servers.take());
        }
    }
}

/// The servers of `kind`, started on the first call in this process.
fn servers(kind: Kind) -> Arc<Servers> {
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain function with no arguments, as `atexit` expects.
        let registered = unsafe { libc::atexit(stop_all) };
        assert_eq!(registered, 0, "atexit");
    });
    // Held while starting, so that two cases never start the same kind twice.
    let mut running = RUNNING[kind.index()]
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    Arc::clone(running.get_or_insert_with(|| Arc::new(Servers::start(kind))))
}

/// A builder for a locker on `servers`, its keys under `prefix`.
fn builder(servers: &Servers, prefix: &str) -> LockerBuilder {
    let builder = match servers {
        Servers::Standalone(server) => Locker::builder().url(server.url()),
        Servers::Cluster(cluster) => Locker::builder().cluster(cluster.urls()),
        Servers::Sentinel(set) => Locker::builder()
            .sentinel(set.sentinel_urls(), set.master_name())
            .replicas(1),
        Servers::Redlock(nodes) => Locker::builder().urls(nodes.iter().map(RedisServer::url)),
        Servers::InMemory => Locker::builder().in_memory(),
    };
    builder.prefix(prefix)
}

/// One case's view of a deployment: its kind, a locker, and where its locks' keys are.
pub struct Env {
    pub kind: Kind,
    pub locker: Locker,
    prefix: String,
    servers: Arc<Servers>,
}

impl Env {
    /// A locker on the servers of `kind` (started if this process has none yet), under a key
    /// prefix that no other case uses.
    pub async fn start(kind: Kind, case: &str) -> Self {
        let servers = tokio::task::spawn_blocking(move || servers(kind))
            .await
            .unwrap();
        let n = CASES.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{case}:{n}:");
        let locker = builder(&servers, &prefix)
            .connect()
            .await
            .expect("locker connects");
        Self {
            kind,
            locker,
            prefix,
            servers,
        }
    }

    /// A builder for a locker of this kind under this case's prefix.
    pub fn builder(&self) -> LockerBuilder {
        builder(&self.servers, &self.prefix)
    }

    /// Another locker of this kind, with connections of its own (in memory: a clone, which
    /// shares the locks).
    pub async fn connect(&self) -> Locker {
        if self.kind == Kind::InMemory {
            return self.locker.clone();
        }
        self.builder().connect().await.expect("locker connects")
    }

    /// The key of the lock `name`.
    pub fn key(&self, name: &str) -> String {
        self.locker.key_of(name)
    }

    /// Connections to the nodes that hold `key` (with Sentinel, the primary and then the
    /// replica; with Redlock, every node).
    async fn nodes_for(&self, key: &str) -> Vec<MultiplexedConnection> {
        match &*self.servers {
            Servers::Standalone(server) => vec![raw_connection(&server.url()).await],
            Servers::Cluster(cluster) => {
                vec![raw_connection_to(cluster.primary_for_key(key).port).await]
            }
            Servers::Sentinel(set) => vec![
                raw_connection(&set.primary().url()).await,
                raw_connection(&set.replicas()[0].url()).await,
            ],
            Servers::Redlock(nodes) => {
                let mut raw = Vec::new();
                for node in nodes {
                    raw.push(raw_connection(&node.url()).await);
                }
                raw
            }
            Servers::InMemory => Vec::new(),
        }
    }

    /// How many nodes have a key of the lock `name`: its own key or one of its permits' keys
    /// (with Sentinel, the primary and the replica count).
    pub async fn nodes_holding(&self, name: &str) -> usize {
        if self.kind == Kind::InMemory {
            let info = self.locker.inspect(name).await.expect("inspect");
            return usize::from(info.is_some());
        }
        let key = self.key(name);
        let mut n = 0;
        for raw in self.nodes_for(&key).await {
            let permits: Vec<String> =
                query(&raw, redis::cmd("KEYS").arg(format!("{key}:permit:*"))).await;
            if exists(&raw, &key).await || !permits.is_empty() {
                n += 1;
            }
        }
        n
    }

    /// How many nodes must have a held lock's key: one server; Cluster's owner of the slot;
    /// Sentinel's primary and the replica that acknowledged it; a Redlock majority.
    pub fn quorum(&self) -> usize {
        match self.kind {
            Kind::Standalone | Kind::Cluster | Kind::InMemory => 1,
            Kind::Sentinel | Kind::Redlock => 2,
        }
    }

    /// How many waiters are queued on the lock `name` (a Redlock lock has no queue: 0).
    pub async fn waiters(&self, name: &str) -> usize {
        let info = self.locker.inspect(name).await.expect("inspect");
        info.map_or(0, |i| i.waiters.len())
    }

    /// How many clients listen for the releases of the lock `name`, on any node (plain or
    /// sharded channels).
    pub async fn listeners(&self, name: &str) -> i64 {
        let channel = format!("{}:released", self.key(name));
        let mut n = 0;
        for raw in self.nodes_for(&self.key(name)).await {
            for kind in ["NUMSUB", "SHARDNUMSUB"] {
                let counts: Vec<(String, i64)> =
                    query(&raw, redis::cmd("PUBSUB").arg(kind).arg(&channel)).await;
                n += counts[0].1;
            }
        }
        n
    }
}
