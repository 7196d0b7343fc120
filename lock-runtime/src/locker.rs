//! `Locker`: the handle users hold, its builder, and the process default.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::acquire::StaleHeads;
use crate::keys::check_name;
use crate::node::{Node, Settings};
use crate::watchdog::Watchdog;
use crate::{Lease, LockError, LockOptions};

/// How long an unused fence counter is kept by default: 7 days.
pub const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Takes, renews and releases locks on one Redis node, or on N independent nodes (Redlock).
/// Cheap to clone: clones share connections and the renewal watchdog.
#[derive(Clone)]
pub struct Locker {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) prefix: String,
    pub(crate) watchdog: Watchdog,
    pub(crate) stale_heads: StaleHeads,
    /// 0: fence counters are kept forever.
    pub(crate) fence_retention_ms: u64,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addrs: Vec<&str> = self.inner.nodes.iter().map(|n| n.addr()).collect();
        f.debug_struct("Locker")
            .field("nodes", &addrs)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

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
    /// counter is kept: about 150 bytes of Redis memory (10,000 names took 1.5 MB on Redis 7.0). An expired counter costs nothing in safety: the next
    /// fence starts from the server's clock in µs, above every fence handed out before, as long
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
        Ok(Locker {
            inner: Arc::new(Inner {
                nodes,
                prefix: self.prefix,
                watchdog: Watchdog::default(),
                stale_heads: StaleHeads::default(),
                fence_retention_ms: self
                    .fence_retention
                    .map_or(0, |d| (d.as_millis() as u64).max(1)),
            }),
        })
    }

    /// Builds the locker and checks that a majority of its nodes answer PING.
    pub async fn connect(self) -> Result<Locker, LockError> {
        let locker = self.build()?;
        locker.check_connection().await?;
        Ok(locker)
    }
}

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

    /// How many nodes must grant a lock: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.nodes.len() / 2 + 1
    }

    pub(crate) fn fence_retention_ms(&self) -> u64 {
        self.inner.fence_retention_ms
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key of the lock `name`.
    pub fn key_of(&self, name: &str) -> String {
        format!("{}{{{name}}}", self.inner.prefix)
    }

    /// PINGs every node (all at once); fails unless a majority answers.
    pub async fn check_connection(&self) -> Result<(), LockError> {
        let nodes = &self.inner.nodes;
        let pings =
            crate::fanout::on_all_nodes(nodes, |node| async move { node.ping().await }).await;
        let mut failures = Vec::new();
        let mut last = None;
        for (node, res) in nodes.iter().zip(pings) {
            if let Err(e) = res {
                failures.push((node.addr().to_owned(), e.to_string()));
                last = Some(node.redis_error("", e));
            }
        }
        let got = self.inner.nodes.len() - failures.len();
        match last {
            Some(err) if self.inner.nodes.len() == 1 => Err(err),
            Some(_) if got < self.quorum() => Err(LockError::QuorumUnavailable {
                name: String::new(),
                got,
                needed: self.quorum(),
                failures,
            }),
            _ => Ok(()),
        }
    }

    /// Takes the lock `name`, waiting up to `opts.wait` for a busy one. The lease is renewed in the
    /// background until it is released or dropped.
    ///
    /// Waiting is woken by the holder's release message. On one node waiters are served in
    /// arrival order: they queue in `<key>:waiters`, a free lock goes to the first of them, and a
    /// waiter that stops coming back loses its place 300 ms after its last attempt.
    ///
    /// Inside a [`run`](Self::run) body (or a `#[distributed_lock]` function) that holds `name`
    /// through this locker, the lease already held is returned at once; releasing or dropping
    /// that one does nothing, the outer call releases.
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease, LockError> {
        opts.validate_for(name)?;
        check_name(name)?;
        if let Some(held) = crate::held::find(self, &self.key_of(name)) {
            return Ok(Lease {
                shared: held,
                locker: self.clone(),
                released: true,
            });
        }
        crate::acquire::acquire(self, name.to_owned(), opts).await
    }

    /// Runs `body` under the lock `name`: acquire, renew, cancel the body at `max_exec` or when
    /// the lock is lost, and release on every path (panics are resumed after the release).
    ///
    /// Reentrant within a task: a nested `run` (or locked function) on a name the current task
    /// already holds through this locker runs at once under the held lease, bounded by its own
    /// `max_exec`, and leaves the release to the outer call. Another task, even one spawned by
    /// the holder, is another holder and waits.
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_runtime::Locker) -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// use lock_runtime::LockOptions;
    /// let opts = LockOptions::new(Duration::from_secs(10));
    /// let fence = locker.run("nightly", &opts, async |lease| lease.fence()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<T, F>(&self, name: &str, opts: &LockOptions, body: F) -> Result<T, LockError>
    where
        F: AsyncFnOnce(&Lease) -> T,
    {
        self.run_owned_name(name.to_owned(), opts, body).await
    }

    pub(crate) async fn run_owned_name<T, F>(
        &self,
        name: String,
        opts: &LockOptions,
        body: F,
    ) -> Result<T, LockError>
    where
        F: AsyncFnOnce(&Lease) -> T,
    {
        opts.validate_for(&name)?;
        check_name(&name)?;
        if let Some(held) = crate::held::find(self, &self.key_of(&name)) {
            let nested = Lease {
                shared: held,
                locker: self.clone(),
                released: true,
            };
            return crate::run::run_body(nested, opts, body).await;
        }
        let lease = crate::acquire::acquire(self, name, opts).await?;
        let shared = Arc::clone(&lease.shared);
        crate::held::holding(self, shared, crate::run::run_body(lease, opts, body)).await
    }
}

/// The process default: a locker, or why none could be made from the environment (kept, so
/// that every locked call reports it rather than panicking).
static DEFAULT: OnceLock<Result<Locker, String>> = OnceLock::new();

/// Sets the locker used by `#[distributed_lock]` functions without a `locker = ..` option.
/// Returns the locker back if a default was already set or made.
pub fn set_default_locker(locker: Locker) -> Result<(), Locker> {
    let mut given = Some(locker);
    DEFAULT.get_or_init(|| Ok(given.take().expect("taken once")));
    match given {
        Some(locker) => Err(locker),
        None => Ok(()),
    }
}

/// The process default locker: the one given to [`set_default_locker`], else one made on first
/// use from `LOCK_REDIS_URL`, then `REDIS_URL`, then `redis://127.0.0.1:6379`.
///
/// A URL from the environment that cannot be parsed is a [`LockError::Config`] naming the
/// variable, returned by this call and by every locked call that uses the default locker.
pub fn default_locker() -> Result<Locker, LockError> {
    let made = DEFAULT.get_or_init(|| {
        let (var, url) = ["LOCK_REDIS_URL", "REDIS_URL"]
            .into_iter()
            .find_map(|v| std::env::var(v).ok().map(|u| (v, u)))
            .unwrap_or(("the built-in default", "redis://127.0.0.1:6379".to_owned()));
        Locker::builder().url(url).build().map_err(|e| {
            format!("cannot make the default locker from {var}: {e}; fix {var} or call set_default_locker")
        })
    });
    match made {
        Ok(locker) => Ok(locker.clone()),
        Err(message) => Err(LockError::config("", message.clone())),
    }
}
