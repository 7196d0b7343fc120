//! Checking a server's set-up at connect: it answers, it is the deployment configured, it has
//! the replicas asked for; and set-up mistakes said in the user's terms.

use redis::{ErrorKind, FromRedisValue, RedisResult, Value};
use tokio::time::Instant;

use super::Node;
use crate::LockError;
use crate::transport::connect::bounded;

impl Node {
    /// Checks that this server answers, and is the kind of deployment it was configured as,
    /// with the replicas that `replicas(n)` asks for.
    pub(crate) async fn check(&self) -> Result<(), LockError> {
        let limit = self.settings.connect_timeout + self.settings.response_timeout;
        let conn = match self.link.conn().await {
            Ok(conn) => conn,
            Err(e) => return Err(self.setup_error(e)),
        };
        let mut ping = conn.clone();
        bounded(limit, redis::cmd("PING").query_async::<()>(&mut ping))
            .await
            .map_err(|e| self.setup_error(e))?;
        // Once connected, one more PING measures the round trip alone.
        let sent = Instant::now();
        bounded(limit, redis::cmd("PING").query_async::<()>(&mut ping))
            .await
            .map_err(|e| self.setup_error(e))?;
        self.rtt.record(sent.elapsed());
        self.answered
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.check_eviction().await?;
        if self.replicas > 0 {
            for (primary, info) in self
                .each_primary("INFO", &["replication"])
                .await
                .map_err(|e| self.setup_error(e))?
            {
                let text = String::from_redis_value(info).unwrap_or_default();
                let connected = text
                    .lines()
                    .find_map(|l| l.strip_prefix("connected_slaves:"))
                    .and_then(|n| n.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if connected < self.replicas {
                    return Err(LockError::config(
                        "",
                        format!(
                            "replicas({}) asks {} replica(s) to acknowledge every acquire and \
                             renewal, but the primary {primary} has {connected} connected \
                             replica(s); add replicas or lower replicas(..)",
                            self.replicas, self.replicas
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Reads each primary's `maxmemory-policy`: one that evicts keys can delete a held lock's
    /// key (every lock key has a ttl, so `volatile-*` policies take them first). Warns once for
    /// this server, or refuses it with `require_noeviction`. A server that refuses `CONFIG`
    /// passes, with a DEBUG note: its policy cannot be seen.
    async fn check_eviction(&self) -> Result<(), LockError> {
        let replies = match self
            .each_primary("CONFIG", &["GET", "maxmemory-policy"])
            .await
        {
            Ok(replies) => replies,
            Err(e) if e.kind() == ErrorKind::Io || e.is_timeout() => {
                return Err(self.setup_error(e));
            }
            Err(e) => {
                tracing::debug!(
                    target: "lock_runtime",
                    server = %self.addr,
                    error = %e,
                    "cannot read maxmemory-policy (CONFIG is not allowed here); make sure the \
                     server does not evict keys"
                );
                return Ok(());
            }
        };
        let evicting: Vec<String> = replies
            .into_iter()
            .filter_map(|(primary, reply)| {
                let policy = policy_of(reply)?;
                (policy != "noeviction").then(|| format!("{primary} ({policy})"))
            })
            .collect();
        if evicting.is_empty() {
            return Ok(());
        }
        let what = format!(
            "maxmemory-policy lets the server evict lock keys on {}: an evicted key lets a \
             second holder in while the first still runs; set `maxmemory-policy noeviction` \
             on the servers that keep locks (or use servers of their own for locks)",
            evicting.join(", ")
        );
        if self.settings.require_noeviction {
            return Err(LockError::config("", what));
        }
        tracing::warn!(target: "lock_runtime", server = %self.addr, "{what}");
        Ok(())
    }

    /// An error met while checking the set-up, said in the user's terms where it is a set-up
    /// mistake.
    fn setup_error(&self, e: redis::RedisError) -> LockError {
        let text = e.to_string();
        if self.is_cluster() && text.contains("cluster support disabled") {
            return LockError::config(
                "",
                format!(
                    "{} is not a Redis Cluster: the server answers that cluster support is \
                     disabled; for a standalone server use `Locker::connect(url)` or \
                     `Locker::builder().url(url)`",
                    self.addr
                ),
            );
        }
        if e.kind() == ErrorKind::MasterNameNotFoundBySentinel {
            return LockError::config(
                "",
                format!(
                    "no Sentinel knows the {}: check the master name (`sentinel monitor <name> ..` \
                     in sentinel.conf, or `SENTINEL MASTERS`)",
                    self.addr
                ),
            );
        }
        self.redis_error("", e)
    }

    /// Sends `cmd args..` to every primary of this deployment (one server: itself); returns each
    /// primary's address and reply.
    async fn each_primary(&self, cmd: &str, args: &[&str]) -> RedisResult<Vec<(String, Value)>> {
        let mut command = redis::cmd(cmd);
        for arg in args {
            command.arg(*arg);
        }
        let limit = self.settings.response_timeout;
        if let Some(cluster) = self.link.cluster() {
            return cluster.each_primary(&command, limit).await;
        }
        let mut conn = self.conn().await?;
        let reply: Value = self.bounded(limit, command.query_async(&mut conn)).await?;
        let addr = self
            .link
            .current_primary()
            .unwrap_or_else(|| self.addr.clone());
        Ok(vec![(addr, reply)])
    }
}

/// The policy in a `CONFIG GET maxmemory-policy` reply (a name-value list, or a map in RESP3).
fn policy_of(reply: Value) -> Option<String> {
    let value = match reply {
        Value::Array(mut items) if items.len() == 2 => items.pop()?,
        Value::Map(mut pairs) if pairs.len() == 1 => pairs.pop()?.1,
        _ => return None,
    };
    String::from_redis_value(value).ok()
}
