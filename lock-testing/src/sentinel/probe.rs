//! What the sentinels say: queries of their state and the bounded waits on it.

use std::collections::HashMap;
use std::time::Duration;

use super::{LOG_LINES, MonitoredNode, SentinelSet};
use crate::admin::{self, log_tail, poll_async};
use crate::server::RedisServer;

impl SentinelSet {
    /// One sentinel reports `primary`, lists every `replicas` as healthy and synced, and passes
    /// `CKQUORUM` (it knows enough other sentinels to authorize a failover).
    pub(super) fn check_sentinel(
        &self,
        port: u16,
        primary: u16,
        replicas: &[u16],
    ) -> Result<(), String> {
        let reported = self.master_port(port)?;
        if reported != primary {
            return Err(format!(
                "sentinel {port} reports primary {reported}, not {primary}"
            ));
        }
        let listed = self.sentinel_replicas(port)?;
        for replica in replicas {
            let entry = listed
                .iter()
                .find(|r| r.get("port") == Some(&replica.to_string()));
            let ok = entry.is_some_and(|r| {
                r.get("flags").is_some_and(|f| healthy_flags(f))
                    && r.get("master-link-status").map(String::as_str) == Some("ok")
            });
            if !ok {
                return Err(format!(
                    "sentinel {port} lists replica {replica} as {entry:?}"
                ));
            }
        }
        admin::query::<String>(port, &["SENTINEL", "CKQUORUM", &self.master_name])
            .map(drop)
            .map_err(|e| format!("sentinel {port}: {e}"))
    }

    /// The primary's port as the sentinel on `port` reports it.
    pub(super) fn master_port(&self, port: u16) -> Result<u16, String> {
        let addr: Option<(String, u16)> = admin::query(
            port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master_name],
        )?;
        addr.map(|(_, p)| p)
            .ok_or_else(|| format!("sentinel {port} does not know {}", self.master_name))
    }

    /// `SENTINEL REPLICAS` of the sentinel on `port`.
    pub(super) fn sentinel_replicas(
        &self,
        port: u16,
    ) -> Result<Vec<HashMap<String, String>>, String> {
        admin::query(port, &["SENTINEL", "REPLICAS", &self.master_name])
    }

    /// The first answer of a running sentinel.
    pub(super) fn ask_sentinels<T>(
        &self,
        ask: impl Fn(u16) -> Result<T, String>,
    ) -> Result<T, String> {
        let mut errors = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
            match ask(sentinel.port()) {
                Ok(answer) => return Ok(answer),
                Err(e) => errors.push(e),
            }
        }
        Err(format!("no running sentinel answered: {errors:?}"))
    }

    pub(super) fn describe(&self, port: u16) -> MonitoredNode {
        MonitoredNode {
            port,
            pid: self.node(port).pid(),
        }
    }

    /// Polls `check` on the runtime; panics with every node's log on timeout.
    pub(super) async fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl FnMut() -> Result<T, String>,
    ) -> T {
        match poll_async(timeout, check).await {
            Ok(value) => value,
            Err(e) => panic!("SentinelSet::{what}: {e}\n{}", self.logs()),
        }
    }

    pub(super) fn logs(&self) -> String {
        let role = |s: &RedisServer| match self.sentinels.iter().any(|x| x.port() == s.port()) {
            true => "sentinel",
            false => "data node",
        };
        self.data
            .iter()
            .chain(&self.sentinels)
            .map(|s| {
                format!(
                    "--- {} {} (pid {}) log tail:\n{}",
                    role(s),
                    s.port(),
                    s.pid(),
                    log_tail(&s.log_contents(), LOG_LINES)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A replica entry's flags with nothing wrong: not subjectively/objectively down, connected.
pub(super) fn healthy_flags(flags: &str) -> bool {
    !flags
        .split(',')
        .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"))
}
