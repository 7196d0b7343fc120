//! Plain reads of a lock's keys, for inspection: one command, one pipeline, or a SCAN of every
//! primary.

use std::collections::BTreeSet;

use redis::{Cmd, FromRedisValue, RedisResult};

use super::Node;
use crate::transport::connect::bounded;

impl Node {
    /// Sends one plain command (for inspection: reads of a lock's keys), bounded by the response
    /// timeout. Keyed commands reach the server that holds the key.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        let mut conn = self.conn().await?;
        self.bounded(self.settings.response_timeout, cmd.query_async(&mut conn))
            .await
    }

    /// Sends a pipeline of plain commands (for inspection: reads of one lock's keys, which share
    /// a slot), bounded by the response timeout.
    pub(crate) async fn query_pipeline<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> RedisResult<T> {
        let mut conn = self.conn().await?;
        self.bounded(self.settings.response_timeout, pipe.query_async(&mut conn))
            .await
    }

    /// The names `name_of` finds in the keys matching `pattern` (SCAN, in batches of
    /// `COUNT 1000`), from every primary that holds keys of this deployment; the scan stops
    /// once `limit` names are found (several keys, such as a lock's permits, may name one).
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        limit: usize,
        name_of: impl Fn(&str) -> Option<String>,
    ) -> RedisResult<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        let scan = |cursor: u64| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            cmd
        };
        // Adds the names of `keys`; true once there are enough.
        let found = |out: &mut BTreeSet<String>, keys: Vec<String>| {
            out.extend(keys.iter().filter_map(|k| name_of(k)));
            out.len() >= limit
        };
        match self.link.cluster() {
            Some(cluster) => {
                let map = cluster.slot_map().await?;
                let mut conn = cluster.conn().await?;
                for primary in 0..map.primaries.len() {
                    let route = redis::cluster_routing::RoutingInfo::SingleNode(
                        crate::transport::cluster::route_to_slot(
                            map.first_slot_of(primary).unwrap_or(0),
                        ),
                    );
                    let mut cursor = 0;
                    loop {
                        let reply = bounded(
                            self.settings.response_timeout,
                            conn.route_command(scan(cursor), route.clone()),
                        )
                        .await?;
                        let (next, keys): (u64, Vec<String>) =
                            FromRedisValue::from_redis_value(reply)?;
                        if found(&mut out, keys) {
                            return Ok(out);
                        }
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
            }
            None => {
                let mut cursor = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = self.query(&scan(cursor)).await?;
                    if found(&mut out, keys) || next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
        }
        Ok(out)
    }
}
