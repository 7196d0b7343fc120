//! One logical Redis server (a standalone server, a Redlock node, a Redis Cluster, or the primary
//! behind Sentinel): the scripts and commands of a lock, sent over its [`Link`]; its release
//! notifications live in `pubsub`.
//!
//! [`Link`]: crate::transport::link::Link

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{
    Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, RedisResult, Script,
    ServerErrorKind,
};

use crate::LockError;
use crate::model::error::redact;
use crate::model::keys::{HANDED_MARK, Keys};
use crate::model::waiter::Waiter;
use crate::plumbing::deadlines::{Bound, Deadlines};
use crate::transport::cluster::ClusterLink;
use crate::transport::connect::{
    Bounded, RoundTrip, Settings, bounded_in, command_config, open_client,
};
use crate::transport::in_process::InProcess;
use crate::transport::link::{Conn, FailoverWatch, Link};
use crate::transport::sentinel::SentinelLink;
use calls::Call;
use pubsub::{Notifications, Source, Subscription, Wake};
use replies::{Raised, Released, ShortRelease};
use url::bad_url;

mod acquire;
mod calls;
pub(crate) mod in_process;
#[cfg(test)]
mod lua_tests;
mod permits;
pub(crate) mod pubsub;
mod reads;
mod renew;
mod replies;
#[cfg(test)]
mod script_tests;
pub(crate) mod scripts;
mod setup;
mod shared;
mod url;

pub(crate) use acquire::{AcquireReply, AcquireRequest, FastReply};
pub(crate) use permits::PermitReply;
pub(crate) use renew::{RENEW_CHUNK, RenewReplies, RenewReply};
pub(crate) use shared::SharedPlace;

/// The reply of [`Node::fence_held`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FenceReply {
    Fence(u64),
    /// The key no longer holds the lease's token: nothing was changed.
    NotOurs,
    /// The counter cannot give a fence: not an integer, or at the largest fence (left
    /// untouched); why.
    Unusable(String),
}

/// How a release goes.
pub(crate) struct Release {
    /// Keep the key this long (`min_hold`); 0 deletes it (or hands it to the first waiter).
    pub keep_ms: u64,
    /// Publish the release even with nobody queued (Redlock: nobody queues).
    pub always_publish: bool,
    /// The fence to record in the counter; 0 when it is recorded already.
    pub record_fence: u64,
    /// The fence counter's retention (the locker's); 0: forever.
    pub fence_retention_ms: u64,
    /// Look at the waiter queue even if no waiter marked the value: an undo of a key the
    /// plain-command path took, which does not know whether waiters queue (see
    /// `Deployment::acquire`).
    pub look_at_queue: bool,
    /// A lease taken by the plain commands: no waiter had queued then, so the key most likely
    /// holds the token unmarked, and `RELEASE_SHORT` is tried first (see [`Node::release`]).
    pub short_first: bool,
}

/// One logical server. `link` carries commands; `notifications` carries release messages on a
/// RESP3 connection of its own.
pub(crate) struct Node {
    /// For messages: `host:port`, or a description of the cluster or the Sentinel set.
    addr: String,
    link: Link,
    settings: Settings,
    rtt: Arc<RoundTrip>,
    notifications: Arc<Notifications>,
    /// A renewal went through: the server has the renewal script.
    renew_loaded: AtomicBool,
    /// The server answered a `PING`: it accepts this URL's credentials (see [`Self::conn`]).
    answered: AtomicBool,
    /// How many replicas must acknowledge each acquire and renewal (`WAIT`); 0: none.
    replicas: usize,
    /// The bounds of this node's requests, in the schedule its locker's nodes share.
    deadlines: Deadlines,
    /// How long an unused fence counter is kept (0: forever), for the counters this node's
    /// undos write (a grant to the next waiter computes a fence).
    fence_retention_ms: u64,
}

impl Node {
    /// One server at a fixed address. Parses the URL and prepares lazy connections; nothing is
    /// sent yet.
    pub(crate) fn direct(
        url: &str,
        settings: Settings,
        tls_root_cert: Option<&[u8]>,
        replicas: usize,
        deadlines: Deadlines,
    ) -> Result<Self, LockError> {
        let bad = |e: redis::RedisError| bad_url(url, &e);
        let info = url.into_connection_info().map_err(bad)?;
        let addr = info.addr().to_string();
        let client = open_client(info.clone(), tls_root_cert).map_err(bad)?;
        let conn = ConnectionManager::new_lazy_with_config(client, command_config(settings))
            .map_err(bad)?;
        let source = Source::direct(&info, tls_root_cert).map_err(bad)?;
        Ok(Self::with_link(
            addr,
            Link::new_direct(conn),
            source,
            settings,
            replicas,
            deadlines,
        ))
    }

    /// A Redis Cluster, from the URLs of some of its nodes.
    pub(crate) fn cluster(
        urls: &[String],
        settings: Settings,
        tls_root_cert: Option<&[u8]>,
        replicas: usize,
        deadlines: Deadlines,
    ) -> Result<Self, LockError> {
        check_urls(urls)?;
        let link = ClusterLink::new(urls, settings, tls_root_cert).map_err(|e| {
            LockError::config("", format!("cannot make a Redis Cluster client: {e}"))
        })?;
        let addr = format!(
            "Redis Cluster {}",
            urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",")
        );
        let source = Source::Cluster {
            urls: urls.to_vec(),
            tls_root_cert: tls_root_cert.map(<[u8]>::to_vec),
        };
        Ok(Self::with_link(
            addr,
            Link::new_cluster(link),
            source,
            settings,
            replicas,
            deadlines,
        ))
    }

    /// The primary that the Sentinels at `urls` name for `master`.
    pub(crate) fn sentinel(
        urls: &[String],
        master: &str,
        settings: Settings,
        replicas: usize,
        deadlines: Deadlines,
    ) -> Result<Self, LockError> {
        check_urls(urls)?;
        let link = Arc::new(
            SentinelLink::new(urls, master, settings)
                .map_err(|e| LockError::config("", format!("cannot ask the Sentinels: {e}")))?,
        );
        let addr = link.describe();
        let node = Self::with_link(
            addr,
            Link::new_sentinel(Arc::clone(&link)),
            Source::Pending,
            settings,
            replicas,
            deadlines,
        );
        // Release notifications follow the primary too.
        let notifications = Arc::downgrade(&node.notifications);
        link.on_switch(Box::new(move |info| {
            if let Some(n) = notifications.upgrade() {
                match Source::direct(info, None) {
                    Ok(source) => n.repoint(source),
                    Err(e) => {
                        tracing::warn!(target: "lock_runtime", error = %e, "cannot listen for releases on the new primary")
                    }
                }
            }
        }));
        Ok(node)
    }

    /// A server in this process (see `Locker::in_memory`): its keys live here, and its scripts
    /// run as their twins.
    pub(crate) fn in_process(settings: Settings, deadlines: Deadlines) -> Self {
        let server = Arc::new(InProcess::new(in_process::twins()));
        let source = Source::InProcess(Arc::clone(&server));
        let link = Link::new_in_process(server);
        Self::with_link(
            "in-process".to_owned(),
            link,
            source,
            settings,
            0,
            deadlines,
        )
    }

    fn with_link(
        addr: String,
        link: Link,
        source: Source,
        settings: Settings,
        replicas: usize,
        deadlines: Deadlines,
    ) -> Self {
        let rtt = Arc::new(RoundTrip::default());
        let notifications = Arc::new(Notifications::new(
            addr.clone(),
            source,
            settings,
            Arc::clone(&rtt),
        ));
        Self {
            addr,
            link,
            settings,
            rtt,
            notifications,
            renew_loaded: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            replicas,
            deadlines,
            fence_retention_ms: scripts::DEFAULT_RETENTION_MS,
        }
    }

    /// Sets how long the fence counters this node writes on its own are kept (its locker's
    /// `fence_retention`).
    pub(crate) fn set_fence_retention(&mut self, ms: u64) {
        self.fence_retention_ms = ms;
    }

    /// An undo, or a waiter passing on a lock granted to it: deletes the key, or grants it to
    /// the first waiter, whether or not the value carries the waiters' mark.
    pub(crate) fn undo(&self) -> Release {
        Release {
            keep_ms: 0,
            always_publish: false,
            record_fence: 0,
            fence_retention_ms: self.fence_retention_ms,
            look_at_queue: true,
            short_first: false,
        }
    }

    /// The schedule of request bounds this node shares with its locker's other nodes.
    pub(crate) fn deadlines(&self) -> &Deadlines {
        &self.deadlines
    }

    /// `host:port` (or the deployment's description), without credentials.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// How many replicas must acknowledge each acquire and renewal.
    pub(crate) fn replicas(&self) -> usize {
        self.replicas
    }

    /// The command that announces a release: sharded pub/sub on a Redis Cluster (the channel
    /// lives in the lock's slot), plain pub/sub elsewhere.
    pub(crate) fn publish_command(&self) -> &'static str {
        if self.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Whether this is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.link.cluster().is_some()
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.settings.response_timeout
    }

    /// A recent round trip to this node (the largest of the last few, roughly).
    pub(crate) fn rtt(&self) -> Duration {
        self.rtt.get()
    }

    pub(crate) fn redis_error(&self, name: &str, source: redis::RedisError) -> LockError {
        if source.kind() == ErrorKind::Parse {
            // Not a Redis server at all: one line that says so, not the parser's dump.
            return LockError::config(
                name,
                format!(
                    "the server at {} does not speak the Redis protocol (its reply is not RESP: \
                     an HTTP server, or another service on that port?); check the URL",
                    self.addr
                ),
            );
        }
        // Say which primary it was.
        let addr = match self.link.current_primary() {
            Some(primary) => format!("{} (primary {primary})", self.addr),
            None => self.addr.clone(),
        };
        LockError::Redis {
            name: name.to_owned(),
            addr,
            error: source,
        }
    }

    /// A connection for one request. The first one is tried with a `PING`: a server that wants
    /// credentials closes the connection of a client that sends a long command without them, and
    /// a script call would fail with a broken pipe instead of the server's `NOAUTH`.
    async fn conn(&self) -> RedisResult<Conn> {
        let conn = self.link.conn().await;
        self.link.check_for_failover(&conn);
        let conn = conn?;
        if !self.answered.load(Ordering::Relaxed) {
            // Boxed: a cold path, kept out of every request's future.
            Box::pin(self.first_contact(conn.clone())).await?;
        }
        Ok(conn)
    }

    /// A `PING` on `conn`; once it is answered, later requests skip it. A `PING` that times out
    /// is not the error: the request that follows is bounded, and says how long it waited.
    async fn first_contact(&self, mut conn: Conn) -> RedisResult<()> {
        let ping = redis::cmd("PING");
        let limit = self.settings.response_timeout;
        match self.bounded(limit, ping.query_async::<()>(&mut conn)).await {
            Ok(()) => self.answered.store(true, Ordering::Relaxed),
            Err(e) if e.is_timeout() => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Runs `request` bounded by `limit` (the connections bound no reply by themselves, see
    /// `connect::command_config`), and lets the link learn from its outcome.
    fn bounded<T, F: Future<Output = RedisResult<T>>>(
        &self,
        limit: Duration,
        request: F,
    ) -> FailoverWatch<'_, Bounded<Bound<'_, F>>> {
        self.link
            .watch_for_failover(bounded_in(&self.deadlines, limit, request))
    }

    /// `WAIT <replicas> <timeout>` when replicas must acknowledge a write of a lease of `ttl_ms`
    /// in a request bounded by `limit`. The timeout stays well inside the lease's validity
    /// (`ttl - drift`): a tenth of it, but at least the drift, and at most a quarter of the
    /// response timeout and half of `limit` (a Redlock node's request has a tenth of the
    /// validity), so that a short acknowledgement is answered, not timed out.
    fn wait_cmd(&self, ttl_ms: u64, limit: Duration) -> Option<Cmd> {
        if self.replicas == 0 {
            return None;
        }
        let ttl = Duration::from_millis(ttl_ms);
        let drift = crate::drift_for(ttl);
        let margin = (ttl.saturating_sub(drift) / 10)
            .max(drift)
            .min(self.settings.response_timeout / 4)
            .min(limit / 2);
        let mut cmd = Cmd::with_capacity(3, 24);
        cmd.arg("WAIT")
            .arg(self.replicas)
            .arg((margin.as_millis() as u64).max(1));
        Some(cmd)
    }

    /// Sends `cmd`, an EVALSHA of `script`, followed by `wait` (a `WAIT`) in the same pipeline
    /// when given; on NOSCRIPT (a new or restarted server) loads the script once and sends it
    /// again. Returns the reply and, with `wait`, how many replicas acknowledged it.
    async fn eval<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
        wait: Option<&Cmd>,
        limit: Duration,
    ) -> RedisResult<(T, Option<usize>)> {
        let mut conn = self.conn().await?;
        // Handed over where it is made: bound to a local first, it would be kept twice.
        self.bounded(limit, async {
            let mut loaded = false;
            loop {
                let out = match wait {
                    None => cmd.query_async::<T>(&mut conn).await.map(|v| (v, None)),
                    Some(wait) => {
                        let mut pipe = redis::Pipeline::with_capacity(2);
                        pipe.add_command(cmd.clone()).add_command(wait.clone());
                        // Boxed (only with `replicas(n)`), as the script load below: the
                        // common call's future stays small.
                        Box::pin(pipe.query_async::<(T, usize)>(&mut conn))
                            .await
                            .map(|(v, acked)| (v, Some(acked)))
                    }
                };
                match out {
                    Err(e)
                        if !loaded && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                    {
                        Box::pin(script.prepare_invoke().load_async(&mut conn)).await?;
                        loaded = true;
                    }
                    other => return other,
                }
            }
        })
        .await
    }

    /// Takes `waiter` out of the lock's queue (it gave up or was cancelled), and passes on a lock
    /// that was granted to one of its `attempts` (their tokens, newest first), or handed to it
    /// the old way.
    ///
    /// A release grants the lock to the last attempt that reached the server, which need not be
    /// the newest one made: redis-rs never sends a request whose caller was dropped before it
    /// went out (a wait cut off just as its next attempt began). A lock left granted to the
    /// attempt before would stay held for the waiter's whole grace.
    pub(crate) async fn leave_queue(
        &self,
        keys: &Keys,
        waiter: &str,
        attempts: [Option<&str>; 2],
    ) -> RedisResult<()> {
        let mut conn = self.conn().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("ZREM").arg(keys.queue()).arg(waiter).ignore();
        pipe.cmd("HDEL")
            .arg(keys.queue_states())
            .arg(waiter)
            .ignore();
        self.bounded(
            self.settings.response_timeout,
            pipe.query_async::<()>(&mut conn),
        )
        .await?;
        // Out of the queue: nothing is granted to this waiter from now on. A lock granted or
        // handed to it meanwhile goes on to the next one (or is freed).
        for token in attempts.into_iter().flatten() {
            if self.release(keys, token, &self.undo()).await? {
                return Ok(());
            }
        }
        let handed = format!("{HANDED_MARK}{waiter}");
        self.release(keys, &handed, &self.undo()).await.map(|_| ())
    }

    /// Whether an acquire here waits for replicas' acknowledgements (then a lock granted by a
    /// release is taken over by an attempt of the waiter's own, which waits for them).
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.replicas > 0
    }

    /// Compare-and-delete (or keep for `keep_ms`, or hand over to the first waiter); true when
    /// the key was ours. See [`scripts::RELEASE`]; a lease taken by the plain commands tries
    /// [`scripts::RELEASE_SHORT`] first, and sends `RELEASE` only when a waiter marked its key
    /// (or it is no longer ours).
    pub(crate) async fn release(
        &self,
        keys: &Keys<impl AsRef<str>>,
        token: &str,
        how: &Release,
    ) -> RedisResult<bool> {
        let limit = self.settings.response_timeout;
        let short = how.short_first
            && how.keep_ms == 0
            && !how.always_publish
            && !how.look_at_queue
            && keys.permits() == 0;
        if short {
            let call = calls::ReleaseShort { keys, token, how };
            let (done, _): (ShortRelease, _) = self
                .eval(call.script(), &call.command(), None, limit)
                .await?;
            if done == ShortRelease::Released {
                return Ok(self.released(keys, Released::Ours, how));
            }
        }
        let call = calls::Release {
            keys,
            token,
            how,
            publish: self.publish_command(),
        };
        let (done, _) = self
            .eval(call.script(), &call.command(), None, limit)
            .await?;
        Ok(self.released(keys, done, how))
    }

    /// What a release script's reply `done` says: whether the key was ours. Waiters in this
    /// process learn of a release now, not one message later.
    fn released(&self, keys: &Keys<impl AsRef<str>>, done: Released, how: &Release) -> bool {
        let wake = match done {
            Released::Ours => Wake::Everyone,
            Released::Handed(grant) => Wake::of(&grant),
            Released::NotOurs => return false,
        };
        if how.keep_ms == 0 {
            self.notifications.released_here(keys, wake);
        }
        true
    }

    /// Computes the fence of a lease taken without one, if the key still holds `token`
    /// (see [`scripts::FENCE`]).
    pub(crate) async fn fence_held(
        &self,
        keys: &Keys,
        token: &str,
        retention_ms: u64,
        limit: Duration,
    ) -> RedisResult<FenceReply> {
        let call = calls::Fence {
            keys,
            token,
            retention_ms,
        };
        let (reply, _) = self
            .eval(call.script(), &call.command(), None, limit)
            .await?;
        Ok(reply)
    }

    /// Raises the fence counter of `keys` to `fence` if it is lower (see
    /// [`scripts::RAISE_FENCE`]).
    pub(crate) async fn raise_fence(
        &self,
        keys: &Keys,
        fence: u64,
        retention_ms: u64,
        limit: Duration,
    ) -> RedisResult<()> {
        let call = calls::RaiseFence {
            keys,
            fence,
            retention_ms,
        };
        let (reply, _) = self
            .eval(call.script(), &call.command(), None, limit)
            .await?;
        match reply {
            Raised::Unusable(why) => Err(RedisError::from((
                ErrorKind::Client,
                "fence counter not raised",
                format!("`{}` {why}", keys.fence()),
            ))),
            Raised::Raised => Ok(()),
        }
    }

    /// Whether a release channel of this server is subscribed now (see
    /// [`Notifications::subscribed`]).
    pub(crate) fn subscribed<const N: usize>(
        &self,
        channels: impl FnOnce() -> [String; N],
    ) -> bool {
        self.notifications.subscribed(channels)
    }

    /// Subscribes to a release channel of this server (see [`Notifications::subscribe`]).
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        waiter: Option<&str>,
    ) -> (Subscription, RedisResult<()>) {
        self.notifications.subscribe(channel, waiter).await
    }
}

/// Checks that every URL parses, before any client is made of them.
fn check_urls(urls: &[String]) -> Result<(), LockError> {
    for url in urls {
        url.as_str()
            .into_connection_info()
            .map_err(|e| bad_url(url, &e))?;
    }
    Ok(())
}
