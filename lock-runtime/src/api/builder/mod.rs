//! `LockerBuilder`: the Redis URL(s), the key prefix and the connection settings of a locker.

use std::sync::Arc;
use std::time::Duration;

mod env;

pub use env::ENV_VARS;

use crate::acquire::Acquirer;
use crate::deployment::Settings;
use crate::deployment::{Setup, cluster, in_memory, redlock, sentinel, standalone};
use crate::model::error::redact;
use crate::model::keys::KeyFormat;
use crate::{LockError, Locker};

/// How long an unused fence counter is kept by default: 7 days.
// Made from the release script's default, which a release then need not send.
pub const DEFAULT_FENCE_RETENTION: Duration =
    Duration::from_millis(crate::deployment::DEFAULT_FENCE_RETENTION_MS);

/// Builds a [`Locker`]: the Redis URL(s), the key prefix and the connection settings.
/// Give it one deployment (`url`, `urls`, `cluster` or `sentinel`): a second one is a
/// [`LockError::Config`] at build, not silently taken over the first.
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
    deployment: Target,
    /// The builder call that chose the deployment, and a later call that chose another one
    /// (refused at build: which one was meant cannot be told).
    deployment_calls: (Option<&'static str>, Option<(&'static str, &'static str)>),
    prefix: String,
    settings: Settings,
    tls_root_cert: Option<Vec<u8>>,
    fence_retention: Option<Duration>,
    replicas: usize,
    label: Option<String>,
    key_format: KeyFormat,
}

/// Which servers a locker uses.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// One server (one URL) or Redlock over N independent servers.
    Servers(Vec<String>),
    /// A Redis Cluster, from the URLs of some of its nodes.
    Cluster(Vec<String>),
    /// The primary that these Sentinels name for this master.
    Sentinel { urls: Vec<String>, master: String },
    /// A server in this process, for tests.
    InMemory,
}

impl Target {
    /// The deployment in a few words, for the log: its kind and its URLs (without credentials).
    fn describe(&self, replicas: usize) -> String {
        let list = |urls: &[String]| -> String {
            let urls: Vec<String> = urls.iter().map(|u| redact(u)).collect();
            urls.join(", ")
        };
        let kind = match self {
            Self::Servers(urls) if urls.len() == 1 => format!("one server, {}", list(urls)),
            Self::Servers(urls) => format!("Redlock over {} servers: {}", urls.len(), list(urls)),
            Self::Cluster(urls) => format!("a Redis Cluster, from {}", list(urls)),
            Self::Sentinel { urls, master } => {
                format!(
                    "the primary of `{master}`, named by the Sentinels {}",
                    list(urls)
                )
            }
            Self::InMemory => "in memory, in this process only".to_owned(),
        };
        match replicas {
            0 => kind,
            n => format!("{kind}; replicas({n})"),
        }
    }
}

impl Default for LockerBuilder {
    fn default() -> Self {
        Self {
            deployment: Target::Servers(Vec::new()),
            deployment_calls: (None, None),
            prefix: "lock:".to_owned(),
            settings: Settings {
                connect_timeout: Duration::from_secs(1),
                response_timeout: Duration::from_secs(1),
                require_noeviction: false,
            },
            tls_root_cert: None,
            fence_retention: Some(DEFAULT_FENCE_RETENTION),
            replicas: 0,
            label: None,
            key_format: KeyFormat::HashTagged,
        }
    }
}

impl LockerBuilder {
    /// One Redis node (`redis://` or `rediss://`, credentials in the URL).
    #[must_use]
    pub fn url(self, url: impl Into<String>) -> Self {
        self.deploy("url", Target::Servers(vec![url.into()]))
    }

    /// N independent nodes for Redlock: a lock holds with a majority of them.
    #[must_use]
    pub fn urls(self, urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.deploy("urls", Target::Servers(strings(urls)))
    }

    /// A Redis Cluster (Redis 7.0 or later), from the URLs of some of its nodes (the rest are
    /// found from them). Every key of one lock shares its `{hash tag}`, so each lock lives in one
    /// slot and is served by that slot's primary: locking works as on one server, with the fair
    /// queue and fences, and requests follow MOVED/ASK during a resharding and the promoted
    /// replica after a failover. Renewals are grouped by primary: one script call per primary
    /// per round, however many leases. Release wake-ups use sharded pub/sub (`SSUBSCRIBE` /
    /// `SPUBLISH`) on the slot's primary.
    ///
    /// A failover can lose a lock whose key had not reached the replica yet; [`replicas`]
    /// narrows that window.
    ///
    /// [`replicas`]: Self::replicas
    #[must_use]
    pub fn cluster(self, seed_urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.deploy("cluster", Target::Cluster(strings(seed_urls)))
    }

    /// The primary that Redis Sentinel names for `master`, found through the Sentinels at
    /// `sentinel_urls` on first use, and again after a failover (when requests fail, or the old
    /// primary answers as a replica). The data nodes are reached with the credentials and
    /// database of the first Sentinel URL.
    ///
    /// A failover can lose a lock whose key had not reached the promoted replica yet;
    /// [`replicas`] narrows that window.
    ///
    /// [`replicas`]: Self::replicas
    #[must_use]
    pub fn sentinel(
        self,
        sentinel_urls: impl IntoIterator<Item = impl Into<String>>,
        master: impl Into<String>,
    ) -> Self {
        let (urls, master) = (strings(sentinel_urls), master.into());
        self.deploy("sentinel", Target::Sentinel { urls, master })
    }

    /// Locks that live in this process, for tests: no Redis is needed or contacted. Every
    /// behaviour of the engine is the same as on one Redis server (waiting in arrival order,
    /// fences, `permits`, `shared`, `lease`, `min_hold`, `max_exec`, inspection, metrics,
    /// tracing), and everything runs on tokio's clock, so `#[tokio::test(start_paused = true)]`
    /// runs a 30 s lease in no real time.
    ///
    /// The locks lock nothing across processes. Within the process they are shared by the
    /// callers of this locker and its clones that run on one tokio runtime: each runtime has
    /// locks of its own, so each `#[tokio::test]` (a runtime of its own) starts with none, also
    /// through the process default locker, and tests that run at once never share a lock.
    #[must_use]
    pub fn in_memory(self) -> Self {
        self.deploy("in_memory", Target::InMemory)
    }

    /// Chooses the deployment; a second choice is remembered as a conflict.
    fn deploy(mut self, call: &'static str, deployment: Target) -> Self {
        if let Some(first) = self.deployment_calls.0 {
            self.deployment_calls.1.get_or_insert((first, call));
        }
        self.deployment_calls.0 = Some(call);
        self.deployment = deployment;
        self
    }

    /// An acquire or renewal counts only once `n` replicas of the primary acknowledged it
    /// (`WAIT n timeout`, sent right behind it on the same connection, with a timeout well inside
    /// the lease's validity: a tenth of `ttl - drift`, at least the drift `ttl/100 + 2ms`, at
    /// most a quarter of the response timeout). An acquire that falls short
    /// deletes its key again and fails with [`LockError::NotReplicated`] (retried within
    /// `wait`); a renewal that falls short ends the lease as lost
    /// ([`LostReason::NotReplicated`](crate::LostReason::NotReplicated)). `connect` checks that
    /// each primary has at least `n` connected replicas.
    ///
    /// What it promises: a lease is handed out, or kept, only while its key is on the primary
    /// and on `n` replicas, so a failover to one of those replicas keeps it. What it does not:
    /// `WAIT` is not consensus. A replica that acknowledged can still lose the key (it restarts
    /// without persistence), Sentinel or the cluster may promote a replica that did not
    /// acknowledge, and the acknowledgement can come after the primary was already cut off. It
    /// narrows the failover window; Redlock over independent primaries is the other road. While
    /// a replica is down, every acquire waits out its `WAIT` timeout, and requests on the same
    /// connection wait behind it.
    #[must_use]
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// A label that names this locker's holder in every key it writes, next to the host name
    /// and process id: `Locker::inspect` and `lockctl` show it (for example a service name, a
    /// pod name, or a job name). Letters, digits and `.`, `_`, `-`, `/` are kept; other
    /// characters become `_`.
    #[must_use]
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// How names become keys (default [`KeyFormat::HashTagged`], `<prefix>{<name>}`).
    /// [`KeyFormat::Plain`] writes exactly `<prefix><name>`, to share locks with clients that
    /// write that key themselves; it is refused on a Redis Cluster, and needs a prefix (not
    /// starting with `{`). Its fence counter and waiter queue are `{<prefix><name>}:fence` and
    /// `{<prefix><name>}:waiters`: no plain key (of this library or another client) can be one.
    #[must_use]
    pub fn key_format(mut self, format: KeyFormat) -> Self {
        self.key_format = format;
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

    /// Refuses, at connect, a server that may evict keys: one whose `maxmemory-policy` is not
    /// `noeviction` (with `allkeys-*` any key may go, with `volatile-*` keys with a ttl go first,
    /// and every lock key has one). An evicted lock key lets a second holder in while the first
    /// still runs. Without this, [`connect`](Self::connect) logs one warning instead. A server
    /// that does not let this client read its configuration (`CONFIG` renamed or not allowed,
    /// as on managed services) is accepted: the policy cannot be seen there.
    #[must_use]
    pub fn require_noeviction(mut self) -> Self {
        self.settings.require_noeviction = true;
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
        if matches!(self.deployment, Target::InMemory) {
            let per_runtime = crate::api::per_runtime::PerRuntime::new(self.clone());
            return Ok(self.build_one()?.with_engines(per_runtime));
        }
        self.build_one()
    }

    /// The one engine of this builder's deployment.
    pub(crate) fn build_one(self) -> Result<Locker, LockError> {
        if let Some((first, then)) = self.deployment_calls.1 {
            return Err(LockError::config(
                "",
                format!(
                    "the builder was given two deployments, `.{first}(..)` and then \
                     `.{then}(..)`: give one (`.url` for one server, `.urls` for Redlock's \
                     nodes, `.cluster`, `.sentinel` or `.in_memory`)"
                ),
            ));
        }
        let cluster = matches!(self.deployment, Target::Cluster(_));
        check_format(cluster, self.key_format, &self.prefix)?;
        let setup = Setup {
            settings: self.settings,
            tls_root_cert: self.tls_root_cert.as_deref(),
            replicas: self.replicas,
            fence_retention_ms: self
                .fence_retention
                .map_or(0, |d| (d.as_millis() as u64).max(1)),
            key_format: self.key_format,
        };
        let deployment = match &self.deployment {
            Target::Servers(urls) => match urls.as_slice() {
                [] => {
                    return Err(LockError::config(
                        "",
                        "no Redis URL given: call `.url(..)`, `.urls(..)`, `.cluster(..)` or `.sentinel(..)`",
                    ));
                }
                [url] => standalone::open(url, &setup)?,
                urls => redlock::open(urls, &setup)?,
            },
            Target::Cluster(urls) => cluster::open(urls, &setup)?,
            Target::Sentinel { urls, master } => sentinel::open(urls, master, &setup)?,
            Target::InMemory if self.replicas > 0 => {
                return Err(LockError::config(
                    "",
                    "replicas(..) asks Redis replicas to acknowledge each write, and an \
                     in-memory locker has none: drop `.replicas(..)` or `.in_memory()`",
                ));
            }
            Target::InMemory => in_memory::open(&setup),
        };
        let suffix = crate::model::holder::suffix(self.label.as_deref());
        // Plain keys may be held by clients that never publish their release: poll too.
        let poll = (self.key_format == KeyFormat::Plain).then_some(PLAIN_KEY_POLL);
        let acquirer = Acquirer::new(Arc::new(deployment), suffix, poll);
        let described = self.deployment.describe(self.replicas);
        Ok(Locker::new(
            acquirer,
            self.prefix,
            self.key_format,
            described,
        ))
    }

    /// Builds the locker and checks it: a majority of its nodes answer, each is the kind of
    /// deployment configured (a cluster URL that points at a standalone server is a `Config`
    /// error, as is a master name no Sentinel knows), with the replicas `replicas(n)` asks for.
    pub async fn connect(self) -> Result<Locker, LockError> {
        let locker = self.build()?;
        locker.check_connection().await?;
        Ok(locker)
    }
}

/// The URLs given to a builder call.
fn strings(urls: impl IntoIterator<Item = impl Into<String>>) -> Vec<String> {
    urls.into_iter().map(Into::into).collect()
}

/// How often a waiter on a [`KeyFormat::Plain`] key retries besides release messages: the other
/// clients of such keys (the Python `acquire_lock` of `SET .. NX EX`) release without publishing.
/// Short against a human's wait, long against a round trip: 20 ms (plus jitter) costs one
/// request per waiter per 20 ms while a foreign holder holds.
const PLAIN_KEY_POLL: Duration = Duration::from_millis(20);

/// A Redis Cluster needs hash-tagged keys.
fn check_format(cluster: bool, format: KeyFormat, prefix: &str) -> Result<(), LockError> {
    if format == KeyFormat::Plain && (prefix.is_empty() || prefix.starts_with('{')) {
        // A plain lock's fence counter and queue are `{<key>}:fence` and the like: out of reach
        // of every plain key only while those keys start with a prefix that is not a `{`.
        return Err(LockError::config(
            "",
            format!(
                "KeyFormat::Plain needs a key prefix that is not empty and does not start with \
                 `{{` (given {prefix:?}): the lock's fence counter and queue are kept under \
                 `{{<key>}}`, where no plain key may reach them; use a prefix such as \"lock:\""
            ),
        ));
    }
    if cluster && format == KeyFormat::Plain {
        return Err(LockError::config(
            "",
            "KeyFormat::Plain is refused on a Redis Cluster: a plain key has no {hash tag}, so a \
             lock's key, fence counter and queue would fall in different slots and its scripts \
             could not run; use the default KeyFormat::HashTagged (keys `<prefix>{<name>}`)",
        ));
    }
    Ok(())
}

/// The ways to make a locker (here, next to the builder they use).
impl Locker {
    /// A builder for a locker with a custom prefix, timeouts, or several nodes.
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// A locker whose locks live in this process, for tests of locked code without Redis (see
    /// [`LockerBuilder::in_memory`]): the same behaviour as on one Redis server, in one process
    /// only. Its clones share its locks on each tokio runtime; each runtime (each
    /// `#[tokio::test]`) has locks of its own, and so has another `in_memory()` locker.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::{LockOptions, Locker};
    /// use std::time::Duration;
    ///
    /// let locker = Locker::in_memory();
    /// let opts = LockOptions::new(Duration::from_secs(30));
    /// let lease = locker.acquire("nightly", &opts).await?;
    /// assert!(locker.inspect("nightly").await?.is_some());
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn in_memory() -> Self {
        Self::builder()
            .in_memory()
            .build()
            .expect("an in-memory locker with the default settings is valid")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_keys_are_refused_on_a_cluster() {
        let err = LockerBuilder::default()
            .cluster(["redis://127.0.0.1:7000"])
            .key_format(KeyFormat::Plain)
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("KeyFormat::Plain is refused on a Redis Cluster"),
            "{err}"
        );
        assert!(check_format(false, KeyFormat::Plain, "lock:").is_ok());
        assert!(check_format(true, KeyFormat::HashTagged, "lock:").is_ok());
    }

    #[tokio::test]
    async fn a_second_deployment_is_refused_not_silently_taken() {
        let builders = [
            LockerBuilder::default()
                .url("redis://a")
                .cluster(["redis://b"]),
            LockerBuilder::default().url("redis://a").url("redis://b"),
            LockerBuilder::default().sentinel(["redis://s"], "m").urls([
                "redis://a",
                "redis://b",
                "redis://c",
            ]),
        ];
        for builder in builders {
            let err = builder.build().unwrap_err().to_string();
            assert!(err.contains("two deployments"), "{err}");
        }
        assert!(LockerBuilder::default().url("redis://a").build().is_ok());
    }

    #[test]
    fn plain_keys_need_a_prefix_their_derived_keys_are_outside_of() {
        for prefix in ["", "{app}:"] {
            let err = check_format(false, KeyFormat::Plain, prefix)
                .unwrap_err()
                .to_string();
            assert!(err.contains("needs a key prefix"), "{prefix:?}: {err}");
        }
        // Hash-tagged keys need none: no lock name holds a brace.
        assert!(check_format(false, KeyFormat::HashTagged, "").is_ok());
    }
}
