//! Test support for `lock-runtime`: real Redis servers and real network faults (Unix only).
//!
//! Add it to your dev-dependencies to test your own locked functions the way `lock-runtime` tests
//! itself:
//!
//! ```toml
//! [dev-dependencies]
//! lock-testing = "0.1"
//! ```
//!
//! - [`RedisServer`] runs a private `redis-server` process (from `REDIS_SERVER_BIN`, else from
//!   `PATH`) on a free loopback port, and can pause, resume, kill and restart it.
//! - [`ServerClock`] steps the wall clock of the servers started with it, and only theirs.
//! - [`FaultProxy`] sits between a client and that server and delays, blackholes or resets the
//!   traffic on demand.
//! - [`RedisCluster`] runs a Redis Cluster of 3 primaries and 3 replicas, tells which node serves
//!   a key ([`key_slot`] computes the hash slot locally), and kills, fails over, reshards and
//!   restarts nodes.
//! - [`SentinelSet`] runs a primary, its replicas and 3 Redis Sentinels, kills the primary and
//!   waits for the failover; optionally the replicas replicate through a [`FaultProxy`], to show
//!   what a failover loses when replication lags.
//!
//! A cluster also needs `redis-cli` (next to `REDIS_SERVER_BIN`, else on `PATH`; it ships with
//! `redis-server`) to create it. Every process is started on a free `127.0.0.1` port in a
//! directory of its own, and killed by its pid when its owner is dropped.
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_testing::{FaultProxy, RedisServer};
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> redis::RedisResult<()> {
//!     let server = RedisServer::start(); // answers PING once this returns
//!     let proxy = FaultProxy::start(server.addr()).await;
//!     let client = redis::Client::open(proxy.url())?;
//!     let mut con = client.get_multiplexed_async_connection().await?;
//!     let _: () = redis::cmd("SET").arg("k").arg(1).query_async(&mut con).await?;
//!
//!     proxy.delay(Duration::from_millis(100)); // slow network
//!     server.pause(); // frozen server (SIGSTOP) ...
//!     server.resume(); // ... thawed
//!     proxy.reset_all(); // dropped connections
//!     server.restart(); // crash and restart, same port, empty data set
//!     Ok(())
//! }
//! ```
//!
//! ```no_run
//! use lock_testing::{RedisCluster, SentinelSet};
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() {
//!     let cluster = RedisCluster::start(); // settled: all ok, in agreement, replicas synced
//!     let owner = cluster.primary_for_key("lock:{job}");
//!     cluster.kill(owner.port);
//!     let promoted = cluster.wait_for_failover(owner.port);
//!     assert_eq!(cluster.primary_for_key("lock:{job}").port, promoted);
//!
//!     let set = SentinelSet::builder().replica_via_proxy(true).start().await;
//!     set.proxy().unwrap().blackhole(); // replication stops; clients still reach the primary
//!     set.kill_primary();
//!     let new_primary = set.wait_for_failover().await;
//!     # let _ = new_primary;
//! }
//! ```

mod admin;
mod clock;
mod cluster;
mod proxy;
mod sentinel;
mod server;
mod slot;
#[cfg(test)]
mod test_resp;

pub use clock::ServerClock;
pub use cluster::{ClusterNode, RedisCluster};
pub use proxy::FaultProxy;
pub use sentinel::{MonitoredNode, SentinelSet, SentinelSetBuilder};
pub use server::{REDIS_SERVER_BIN_ENV, RedisServer};
pub use slot::{SLOT_COUNT, key_slot};

/// The Redis to run an example or a demo against: `REDIS_URL` when set, else a private
/// [`RedisServer`] (returned too, so that it lives as long as the caller keeps it).
pub fn redis_url_or_private_server() -> (String, Option<RedisServer>) {
    match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = RedisServer::start();
            (server.url(), Some(server))
        }
    }
}
