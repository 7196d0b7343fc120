//! The primary behind Redis Sentinel: asked of the Sentinels on first use, and again whenever a
//! request fails in a way that may mean a failover (the primary does not answer, or answers as a
//! replica with READONLY), so that a locker follows the promoted replica by itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, RedisResult, ServerErrorKind,
};
use tokio::time::Instant;

use crate::plumbing::unpoisoned::{Unpoisoned, UnpoisonedRw};
use crate::transport::connect::{Settings, bounded, command_config};

/// Asks the Sentinels at most this often while requests keep failing.
const RESOLVE_EVERY: Duration = Duration::from_millis(100);

/// Called with the new primary's connection info whenever the primary changes (and on the first
/// resolution), so that release notifications follow it too.
pub(crate) type OnSwitch = Box<dyn Fn(&ConnectionInfo) + Send + Sync>;

/// The primary that a set of Sentinels names for one master name.
pub(crate) struct SentinelLink {
    sentinel: tokio::sync::Mutex<Sentinel>,
    master: String,
    node_info: SentinelNodeConnectionInfo,
    settings: Settings,
    current: RwLock<Option<Primary>>,
    /// One resolution at a time.
    resolving: tokio::sync::Mutex<()>,
    /// A background resolution is under way or due.
    suspected: AtomicBool,
    last_resolution: Mutex<Option<Instant>>,
    on_switch: OnceLock<OnSwitch>,
    /// The Sentinels' addresses, for messages.
    sentinels: String,
}

#[derive(Clone)]
struct Primary {
    addr: String,
    conn: ConnectionManager,
}

impl SentinelLink {
    /// Parses the Sentinels' URLs; nothing is sent until the first request. The data nodes are
    /// reached with the credentials and database of the first Sentinel URL.
    pub(crate) fn new(urls: &[String], master: &str, settings: Settings) -> RedisResult<Self> {
        let infos: Vec<ConnectionInfo> = urls
            .iter()
            .map(|u| u.as_str().into_connection_info())
            .collect::<RedisResult<_>>()?;
        let node_info = SentinelNodeConnectionInfo::default().set_redis_connection_info(
            infos
                .first()
                .map(|i| i.redis_settings().clone())
                .unwrap_or_default(),
        );
        let sentinels = infos
            .iter()
            .map(|i| i.addr().to_string())
            .collect::<Vec<_>>()
            .join(",");
        // Sentinels are asked without credentials of their own beyond what their URLs carry.
        let sentinel = Sentinel::build(infos)?;
        Ok(Self {
            sentinel: tokio::sync::Mutex::new(sentinel),
            master: master.to_owned(),
            node_info,
            settings,
            current: RwLock::new(None),
            resolving: tokio::sync::Mutex::new(()),
            suspected: AtomicBool::new(false),
            last_resolution: Mutex::new(None),
            on_switch: OnceLock::new(),
            sentinels,
        })
    }

    /// `master <name> via <sentinels>`, for messages.
    pub(crate) fn describe(&self) -> String {
        format!("master `{}` via Sentinels {}", self.master, self.sentinels)
    }

    /// Registers what to do when the primary changes (once).
    pub(crate) fn on_switch(&self, f: OnSwitch) {
        let _ = self.on_switch.set(f);
    }

    /// The connection to the current primary, asking the Sentinels first if none is known yet
    /// (in a task of its own, so that a caller that gives up does not cut the answer short).
    pub(crate) async fn conn(self: &Arc<Self>) -> RedisResult<ConnectionManager> {
        if let Some(p) = self.current.read_now().as_ref() {
            return Ok(p.conn.clone());
        }
        let me = Arc::clone(self);
        tokio::spawn(async move { me.resolve().await })
            .await
            .map_err(|_| RedisError::from((ErrorKind::Io, "the Sentinel lookup task ended")))?
    }

    /// The address of the current primary, if one is known.
    pub(crate) fn primary_addr(&self) -> Option<String> {
        self.current.read_now().as_ref().map(|p| p.addr.clone())
    }

    /// A request failed: if the error may mean a failover, ask the Sentinels again in the
    /// background (at most every 100 ms while failures go on).
    pub(crate) fn suspect(self: &Arc<Self>, error: &RedisError) {
        let failover = error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || matches!(
                error.kind(),
                ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
                    | ErrorKind::Io
            );
        if !failover || self.suspected.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.suspected.store(false, Ordering::Release);
            return;
        };
        let me = Arc::clone(self);
        handle.spawn(async move {
            let since = *me.last_resolution.locked();
            if let Some(at) = since {
                tokio::time::sleep_until(at + RESOLVE_EVERY).await;
            }
            me.suspected.store(false, Ordering::Release);
            if let Err(e) = me.resolve().await {
                tracing::debug!(target: "lock_runtime", master = %me.master, error = %e, "Sentinels did not name a primary yet; asking again on the next failure");
            }
        });
    }

    /// Asks the Sentinels for the primary; switches to it if it changed.
    async fn resolve(self: &Arc<Self>) -> RedisResult<ConnectionManager> {
        let _one = self.resolving.lock().await;
        *self.last_resolution.locked() = Some(Instant::now());
        let limit = self.settings.connect_timeout + self.settings.response_timeout * 2;
        let client = bounded(limit, async {
            let mut sentinel = self.sentinel.lock().await;
            sentinel
                .async_master_for(&self.master, Some(&self.node_info))
                .await
        })
        .await?;
        let info = client.get_connection_info().clone();
        let addr = info.addr().to_string();
        if let Some(p) = self.current.read_now().as_ref()
            && p.addr == addr
        {
            return Ok(p.conn.clone());
        }
        let conn = ConnectionManager::new_lazy_with_config(client, command_config(self.settings))?;
        let previous = self.current.write_now().replace(Primary {
            addr: addr.clone(),
            conn: conn.clone(),
        });
        match previous {
            Some(old) => tracing::info!(
                target: "lock_runtime",
                master = %self.master, from = %old.addr, to = %addr,
                "Sentinel named a new primary; following it"
            ),
            None => {
                tracing::debug!(target: "lock_runtime", master = %self.master, %addr, "Sentinel named the primary")
            }
        }
        if let Some(f) = self.on_switch.get() {
            f(&info);
        }
        Ok(conn)
    }
}
