//! N private redis-servers for the Redlock tests, with raw access to each one.

use std::time::Duration;

use lock_runtime::Locker;
use lock_testing::{FaultProxy, RedisServer};

use super::raw_connection;

/// Independent redis-servers (no replication between them), each on its own port.
pub struct Nodes {
    pub servers: Vec<RedisServer>,
}

impl Nodes {
    /// Starts `n` servers; returns once each answers PING.
    pub fn start(n: usize) -> Self {
        Self {
            servers: (0..n).map(|_| RedisServer::start()).collect(),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// `127.0.0.1:PORT` of node `i`, as the engine names it in errors.
    pub fn addr(&self, i: usize) -> String {
        self.servers[i].addr().to_string()
    }

    /// A Redlock locker over every node with these connect and response timeouts, built
    /// without connecting (so nodes that are down do not make this fail).
    pub fn locker(&self, timeout: Duration) -> Locker {
        locker_over(self.urls(), timeout)
    }

    /// A fault proxy in front of each node, in the nodes' order.
    pub async fn proxies(&self) -> Vec<FaultProxy> {
        let mut proxies = Vec::new();
        for s in &self.servers {
            proxies.push(FaultProxy::start(s.addr()).await);
        }
        proxies
    }

    /// Indexes of the running nodes.
    pub fn live(&self) -> Vec<usize> {
        (0..self.servers.len())
            .filter(|&i| self.servers[i].is_running())
            .collect()
    }

    /// Sends one command to node `i` on a fresh connection (nodes get killed and restarted).
    pub async fn query<T: redis::FromRedisValue>(&self, i: usize, cmd: &redis::Cmd) -> T {
        let mut raw = raw_connection(&self.servers[i].url()).await;
        cmd.query_async(&mut raw)
            .await
            .unwrap_or_else(|e| panic!("node {i} ({}): {e}", self.addr(i)))
    }

    /// How many EVALSHA calls node `i` ran since its stats were last reset.
    pub async fn evalsha_calls(&self, i: usize) -> u64 {
        let info: String = self.query(i, redis::cmd("INFO").arg("commandstats")).await;
        super::calls_in(&info, "evalsha")
    }

    pub async fn reset_stats(&self, i: usize) {
        super::reset_stats(&raw_connection(&self.servers[i].url()).await).await;
    }

    pub async fn get(&self, i: usize, key: &str) -> Option<String> {
        self.query(i, redis::cmd("GET").arg(key)).await
    }

    pub async fn pttl(&self, i: usize, key: &str) -> i64 {
        self.query(i, redis::cmd("PTTL").arg(key)).await
    }

    /// `SET key value PX ttl_ms` on node `i`.
    pub async fn set(&self, i: usize, key: &str, value: &str, ttl_ms: u64) {
        let () = self
            .query(
                i,
                redis::cmd("SET").arg(key).arg(value).arg("PX").arg(ttl_ms),
            )
            .await;
    }

    /// The running nodes on which `key` exists.
    pub async fn holders(&self, key: &str) -> Vec<usize> {
        let mut out = Vec::new();
        for i in self.live() {
            if self.query::<i64>(i, redis::cmd("EXISTS").arg(key)).await == 1 {
                out.push(i);
            }
        }
        out
    }

    /// How many clients of node `i` are subscribed to `channel`.
    pub async fn subscribers(&self, i: usize, channel: &str) -> i64 {
        let n: Vec<(String, i64)> = self
            .query(i, redis::cmd("PUBSUB").arg("NUMSUB").arg(channel))
            .await;
        n[0].1
    }
}

/// A Redlock locker that reaches its nodes through `proxies`, with these connect and response
/// timeouts, not yet connected.
pub fn locker_through(proxies: &[FaultProxy], timeout: Duration) -> Locker {
    locker_over(proxies.iter().map(FaultProxy::url).collect(), timeout)
}

/// A Redlock locker over `urls` with these connect and response timeouts, not yet connected.
pub fn locker_over(urls: Vec<String>, timeout: Duration) -> Locker {
    Locker::builder()
        .urls(urls)
        .connect_timeout(timeout)
        .response_timeout(timeout)
        .build()
        .expect("valid URLs")
}
