//! `LockerBuilder`: the Redis URL(s), the key prefix and the connection settings of a locker.

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Acquirer;
use crate::connect::Settings;
use crate::node::Node;
use crate::quorum::Quorum;
use crate::{LockError, Locker};

/// How long an unused fence counter is kept by default: 7 days.
pub const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Builds a [`Locker`]: the Redis URL(s), the key prefix and the connection settings.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// let locker = lock_runtime::Locker::builder()
///     .url("redis://127.0.0.1:6379")
///     .prefix("myapp:lock:")
///     .response_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LockerBuilder {
    urls: Vec<String>,
    prefix: String,
    settings: Settings,
    tls_root_cert: Option<Vec<u8>>,
    fence_retention: Option<Duration>,
}

impl Default for LockerBuilder {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            prefix: "lock:".to_owned(),
            settings: Settings {
                connect_timeout: Duration::from_secs(1),
                response_timeout: Duration::from_secs(1),
            },
            tls_root_cert: None,
            fence_retention: Some(DEFAULT_FENCE_RETENTION),
        }
    }
}

impl LockerBuilder {
    /// One Redis node (`redis://` or `rediss://`, credentials in the URL).
    #[must_use]
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.urls = vec![url.into()];
        self
    }

    /// N independent nodes for Redlock: a lock holds with a majority of them.
    #[must_use]
    pub fn urls<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.urls = urls.into_iter().map(Into::into).collect();
        self
    }

    /// Prefix of every key (default `lock:`); the key of lock `n` is `<prefix>{n}`.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Bound on establishing a connection (default 1 s).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Bound on each reply (default 1 s).
    #[must_use]
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.response_timeout = timeout;
        self
    }

    /// Trusts this root certificate (PEM) for `rediss://` servers instead of the system's trust
    /// store, e.g. a private CA. Needs the `tls` feature.
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into());
        self
    }

    /// How long a lock name's fence counter is kept after its last acquisition (default 7 days;
    /// `None` keeps counters forever). Each name ever locked costs one small key while its
    /// counter is kept: about 150 bytes of Redis memory (10,000 names took 1.5 MB on Redis 7.0).
    /// An expired counter costs nothing in safety: the next fence starts from the server's clock in µs, above every fence handed out before, as long
    /// as that clock has not gone back by more than the time since. Shorter retention bounds
    /// memory for names rendered from arguments; `None` keeps fences independent of the clock
    /// after long idle periods.
    #[must_use]
    pub fn fence_retention(mut self, retention: Option<Duration>) -> Self {
        self.fence_retention = retention;
        self
    }

    /// Builds the locker without connecting: the first lock call connects.
    pub fn build(self) -> Result<Locker, LockError> {
        if self.urls.is_empty() {
            return Err(LockError::config(
                "",
                "no Redis URL given: call `.url(..)` or `.urls(..)`",
            ));
        }
        let nodes = self
            .urls
            .iter()
            .map(|u| Node::new(u, self.settings, self.tls_root_cert.as_deref()).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let retention_ms = self
            .fence_retention
            .map_or(0, |d| (d.as_millis() as u64).max(1));
        let acquirer = Acquirer::new(Arc::new(Quorum::new(nodes, retention_ms)));
        Ok(Locker::new(acquirer, self.prefix))
    }

    /// Builds the locker and checks that a majority of its nodes answer PING.
    pub async fn connect(self) -> Result<Locker, LockError> {
        let locker = self.build()?;
        locker.check_connection().await?;
        Ok(locker)
    }
}

/// The ways to make a locker (here, next to the builder they use).
impl Locker {
    /// A builder for a locker with a custom prefix, timeouts, or several nodes.
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// Connects to one Redis node: `redis://[user:password@]host:port[/db]` or `rediss://...`.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder().url(url).connect().await
    }

    /// Connects to N independent Redis nodes; locks hold with a majority (Redlock).
    ///
    /// - An acquire goes to every node at once, each bounded by a per-node timeout of
    ///   `min(response timeout, (ttl - drift) / 10)`. The lock holds when `N/2 + 1` of the
    ///   configured N nodes (not of the reachable ones) granted it and the lease is still valid
    ///   (`ttl - elapsed - drift > 0`). Otherwise the keys it took are deleted before the call
    ///   returns (on a node whose reply is still out, as soon as it answers), and the attempt
    ///   gives up as soon as a majority is out of reach: `Busy` when others hold the lock,
    ///   `QuorumUnavailable` (naming each failed node and why) when too many nodes failed. Within
    ///   `wait`, both are retried; `QuorumUnavailable` is returned when the wait runs out.
    /// - Renewal and release go to every node too; the lease stays held only while a majority
    ///   confirms its renewals in time, and is `Lost` otherwise. A node that stops answering
    ///   delays neither.
    /// - Fences: each granted node counts its own; before the lease is handed out, every granted
    ///   node's counter is raised to their maximum, so the next majority, which shares a node with
    ///   this one, counts past it and fences never go backwards.
    /// - **Delayed restart rule.** A node that restarts without persistence comes back empty: it
    ///   must stay out for at least the longest ttl in use, or it can grant a lock that is still
    ///   held to a second majority. Its fence counter restarts from the server's clock in
    ///   microseconds, above every fence handed out before, as long as that clock does not go
    ///   back. Use persistence (`appendonly yes`, `appendfsync always`) where that matters.
    pub async fn redlock<I, S>(urls: I) -> Result<Self, LockError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder().urls(urls).connect().await
    }
}
