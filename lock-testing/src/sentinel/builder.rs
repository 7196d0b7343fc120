//! [`SentinelSetBuilder`]: the options of a `SentinelSet`, and starting it.

use std::sync::Mutex;

use super::config::{data_node_args, sentinel_conf};
use super::{SENTINELS, START_TIMEOUT, SentinelSet};
use crate::admin::{replica_online_at_primary, replica_synced};
use crate::proxy::FaultProxy;
use crate::server::{NodeSpec, RedisServer, make_temp_dir, server_bin};

/// Options of a [`SentinelSet`]; [`start`](Self::start) launches it.
#[derive(Clone, Debug)]
pub struct SentinelSetBuilder {
    replicas: usize,
    via_proxy: bool,
    master_name: String,
}

impl Default for SentinelSetBuilder {
    fn default() -> Self {
        SentinelSetBuilder {
            replicas: 1,
            via_proxy: false,
            master_name: "mymaster".to_owned(),
        }
    }
}

impl SentinelSetBuilder {
    /// Number of replicas (default 1).
    ///
    /// # Panics
    ///
    /// If `n` is 0: a failover needs a replica.
    pub fn replicas(mut self, n: usize) -> Self {
        assert!(n >= 1, "SentinelSet: at least one replica is needed");
        self.replicas = n;
        self
    }

    /// When `true`, the replicas replicate through one [`FaultProxy`] in front of the primary
    /// (see [`SentinelSet::proxy`]); default `false`.
    ///
    /// The replicas still announce their own address, so the sentinels and clients reach them
    /// directly, and the sentinels are kept from "fixing" their configuration to bypass the proxy
    /// (a sentinel ACL user on the replicas allows `REPLICAOF NO ONE` only) until a failover
    /// (after which replicas follow the new primary directly). A blackhole keeps the replication
    /// link open, so the replicas stay eligible for promotion; past the replicas' `repl-timeout`
    /// (60 s) they would drop the link, and a replica disconnected for more than ten times the
    /// down-after time (10 s) before the primary fails is not promoted.
    pub fn replica_via_proxy(mut self, via_proxy: bool) -> Self {
        self.via_proxy = via_proxy;
        self
    }

    /// The name the sentinels monitor the primary under (default `mymaster`).
    ///
    /// # Panics
    ///
    /// If `name` is empty or has characters other than ASCII letters, digits, `.`, `_`, `-`.
    pub fn master_name(mut self, name: &str) -> Self {
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        assert!(
            !name.is_empty() && name.chars().all(valid),
            "SentinelSet: bad master name {name:?}"
        );
        self.master_name = name.to_owned();
        self
    }

    /// Starts the primary, then its replicas, waits until they are synced, then starts the
    /// sentinels and returns once every sentinel reports the primary, lists every replica as
    /// healthy, and knows the other sentinels (`SENTINEL CKQUORUM` passes). Takes about 2–3 s
    /// (sentinels find each other through 2 s hello messages).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, if `redis-server` cannot be found, or if the set is not ready
    /// within 20 s (with the logs).
    pub async fn start(self) -> SentinelSet {
        let bin = server_bin();
        let launch = |args: Vec<String>| {
            RedisServer::launch_node(NodeSpec {
                bin: bin.clone(),
                dir: make_temp_dir(),
                conf_file: None,
                sentinel: false,
                cluster_bus: false,
                args: args.into_iter().map(Into::into).collect(),
                env: Vec::new(),
            })
        };
        let primary = launch(data_node_args(self.via_proxy, false, None));
        let proxy = match self.via_proxy {
            true => Some(FaultProxy::start(primary.addr()).await),
            false => None,
        };
        let upstream = proxy.as_ref().map_or(primary.port(), |p| p.addr().port());
        let mut data = vec![primary];
        for _ in 0..self.replicas {
            data.push(launch(data_node_args(
                self.via_proxy,
                self.via_proxy,
                Some(upstream),
            )));
        }
        let primary_port = data[0].port();
        let mut set = SentinelSet {
            sentinels: Vec::new(),
            data,
            proxy,
            master_name: self.master_name,
            primary: Mutex::new(primary_port),
        };
        // Replicas synced before the sentinels start: a sentinel then learns them from its very
        // first INFO of the primary, instead of 10 s later.
        let replica_ports: Vec<u16> = set.data[1..].iter().map(|s| s.port()).collect();
        set.wait("start", START_TIMEOUT, || {
            replica_ports.iter().try_for_each(|&port| {
                replica_synced(port)?;
                replica_online_at_primary(primary_port, port)
            })
        })
        .await;
        for _ in 0..SENTINELS {
            let dir = make_temp_dir();
            let conf = dir.join("sentinel.conf");
            let text = sentinel_conf(&set.master_name, primary_port, self.via_proxy);
            if let Err(e) = std::fs::write(&conf, text) {
                panic!("SentinelSet: cannot write {}: {e}", conf.display());
            }
            set.sentinels.push(RedisServer::launch_node(NodeSpec {
                bin: bin.clone(),
                dir,
                conf_file: Some(conf),
                sentinel: true,
                cluster_bus: false,
                args: Vec::new(),
                env: Vec::new(),
            }));
        }
        set.wait("start", START_TIMEOUT, || {
            set.sentinels
                .iter()
                .try_for_each(|s| set.check_sentinel(s.port(), primary_port, &replica_ports))
        })
        .await;
        set
    }
}
