//! One logical Redis server (a standalone server, a Redlock node, a Redis Cluster, or the primary
//! behind Sentinel): the scripts and commands of a lock, sent over its [`Link`]; its release
//! notifications live in `pubsub`.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{
    Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisResult, Script, ServerErrorKind, Value,
};
use tokio::time::Instant;

use crate::LockError;
use crate::cluster::ClusterLink;
use crate::connect::{RoundTrip, Settings, bounded, manager_config, open_client, redact};
use crate::keys::Keys;
use crate::link::{Conn, Link};
use crate::pubsub::{Notifications, Source, Subscription};
use crate::scripts::{self, evalsha};
use crate::sentinel::SentinelLink;

/// What one acquire attempt sends besides the keys.
pub(crate) struct AcquireRequest<'a> {
    pub token: &'a str,
    pub ttl_ms: u64,
    /// This caller's place in the queue, if it waits (one node only).
    pub waiter: Option<&'a Waiter>,
    /// A queue head seen unchanged for longer than its grace: `(id, state)`.
    pub evict: Option<(&'a str, &'a str)>,
    /// Fence floor granularity in µs: 1 on one server, 1 s on a Redlock node.
    pub fence_quantum: u64,
    /// How long an unused fence counter is kept; 0 forever.
    pub fence_retention_ms: u64,
    /// Bound on the reply.
    pub limit: Duration,
}

/// A waiter's identity in the queue and the grace it asks for.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub id: String,
    pub grace: Duration,
}

/// How a release goes.
pub(crate) struct Release {
    /// Keep the key this long (`min_hold`); 0 deletes it (or hands it to the first waiter).
    pub keep_ms: u64,
    /// Publish the release even with nobody queued (Redlock: nobody queues).
    pub always_publish: bool,
    /// The fence to record in the counter; 0 when it is recorded already.
    pub record_fence: u64,
    pub fence_retention_ms: u64,
}

/// The reply of the uncontended path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FastReply {
    Taken {
        fence: u64,
    },
    /// Held by someone else.
    Busy,
    /// For the script to tell; `taken` when the plain `SET NX` did set the key.
    Unclear {
        taken: bool,
    },
    /// Taken, but fewer replicas than asked acknowledged it in time; the key was deleted again.
    NotReplicated {
        acked: usize,
    },
}

/// The reply to an acquire attempt on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    Taken {
        fence: u64,
    },
    /// Held by someone else; the remaining PTTL when the key has one.
    Busy {
        pttl: Option<Duration>,
    },
    /// Free, but another waiter is first in line: its id and its state (nonce and grace).
    NotOurTurn {
        head: String,
        state: String,
    },
    /// The lock key, or its fence counter, holds data that is not ours; nothing was changed.
    Foreign {
        detail: String,
    },
    /// Taken, but fewer replicas than asked acknowledged it in time; the key was deleted again.
    NotReplicated {
        acked: usize,
    },
}

/// What one server said of one lease in a renewal round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewReply {
    Renewed,
    NotOwner,
    /// Renewed on the primary, but fewer replicas than asked acknowledged it in time.
    NotReplicated,
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
    /// How many replicas must acknowledge each acquire and renewal (`WAIT`); 0: none.
    replicas: usize,
}

/// Most leases in one renewal script call.
pub(crate) const RENEW_CHUNK: usize = 1000;

impl Node {
    /// One server at a fixed address. Parses the URL and prepares lazy connections; nothing is
    /// sent yet.
    pub(crate) fn direct(
        url: &str,
        settings: Settings,
        tls_root_cert: Option<&[u8]>,
        replicas: usize,
    ) -> Result<Self, LockError> {
        let bad = |e: redis::RedisError| bad_url(url, &e);
        let info = url.into_connection_info().map_err(bad)?;
        let addr = info.addr().to_string();
        let client = open_client(info.clone(), tls_root_cert).map_err(bad)?;
        let conn = ConnectionManager::new_lazy_with_config(client, manager_config(settings))
            .map_err(bad)?;
        let source = Source::direct(&info, tls_root_cert).map_err(bad)?;
        Ok(Self::with_link(
            addr,
            Link::Direct(conn),
            source,
            settings,
            replicas,
        ))
    }

    /// A Redis Cluster, from the URLs of some of its nodes.
    pub(crate) fn cluster(
        urls: &[String],
        settings: Settings,
        tls_root_cert: Option<&[u8]>,
        replicas: usize,
    ) -> Result<Self, LockError> {
        for url in urls {
            url.as_str()
                .into_connection_info()
                .map_err(|e| bad_url(url, &e))?;
        }
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
            Link::Cluster(Box::new(link)),
            source,
            settings,
            replicas,
        ))
    }

    /// The primary that the Sentinels at `urls` name for `master`.
    pub(crate) fn sentinel(
        urls: &[String],
        master: &str,
        settings: Settings,
        replicas: usize,
    ) -> Result<Self, LockError> {
        for url in urls {
            url.as_str()
                .into_connection_info()
                .map_err(|e| bad_url(url, &e))?;
        }
        let link = Arc::new(
            SentinelLink::new(urls, master, settings)
                .map_err(|e| LockError::config("", format!("cannot ask the Sentinels: {e}")))?,
        );
        let addr = link.describe();
        let node = Self::with_link(
            addr,
            Link::Sentinel(Arc::clone(&link)),
            Source::Pending,
            settings,
            replicas,
        );
        // Release notifications follow the primary too.
        let notifications = Arc::downgrade(&node.notifications);
        link.on_switch(Box::new(move |info| {
            if let Some(n) = notifications.upgrade() {
                match Source::direct(info, None) {
                    Ok(source) => n.repoint(source),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot listen for releases on the new primary")
                    }
                }
            }
        }));
        Ok(node)
    }

    fn with_link(
        addr: String,
        link: Link,
        source: Source,
        settings: Settings,
        replicas: usize,
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
            replicas,
        }
    }

    /// `host:port` (or the deployment's description), without credentials.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// How many replicas must acknowledge each acquire and renewal.
    pub(crate) fn replicas(&self) -> usize {
        self.replicas
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
        let addr = match &self.link {
            // Say which primary it was.
            Link::Sentinel(s) => match s.primary_addr() {
                Some(primary) => format!("{} (primary {primary})", self.addr),
                None => self.addr.clone(),
            },
            _ => self.addr.clone(),
        };
        LockError::Redis {
            name: name.to_owned(),
            addr,
            source,
        }
    }

    /// A connection for one request.
    async fn conn(&self) -> RedisResult<Conn> {
        let conn = self.link.conn().await;
        self.link.observe(&conn);
        conn
    }

    /// Runs `request` bounded by `limit` (no second timer where the connection already bounds
    /// each reply by the same limit), and lets the link learn from its outcome.
    async fn bounded<T>(
        &self,
        limit: Duration,
        request: impl Future<Output = RedisResult<T>>,
    ) -> RedisResult<T> {
        let out = if self.link.bounds_replies() && limit >= self.settings.response_timeout {
            request.await
        } else {
            bounded(limit, request).await
        };
        self.link.observe(&out);
        out
    }

    /// `WAIT <replicas> <timeout>` when replicas must acknowledge a write of a lease of `ttl_ms`.
    /// The timeout stays well inside the lease's validity (`ttl - drift`): a tenth of it, but at
    /// least the drift, and at most a quarter of the response timeout.
    fn wait_cmd(&self, ttl_ms: u64) -> Option<Cmd> {
        if self.replicas == 0 {
            return None;
        }
        let ttl = Duration::from_millis(ttl_ms);
        let drift = crate::drift(ttl);
        let margin = (ttl.saturating_sub(drift) / 10)
            .max(drift)
            .min(self.settings.response_timeout / 4);
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
        let call = async {
            let mut loaded = false;
            loop {
                let out = match wait {
                    None => cmd.query_async::<T>(&mut conn).await.map(|v| (v, None)),
                    Some(wait) => {
                        let mut pipe = redis::Pipeline::with_capacity(2);
                        pipe.add_command(cmd.clone()).add_command(wait.clone());
                        pipe.query_async::<(T, usize)>(&mut conn)
                            .await
                            .map(|(v, acked)| (v, Some(acked)))
                    }
                };
                match out {
                    Err(e)
                        if !loaded && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                    {
                        script.prepare_invoke().load_async(&mut conn).await?;
                        loaded = true;
                    }
                    other => return other,
                }
            }
        };
        self.bounded(limit, call).await
    }

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
        match &self.link {
            Link::Cluster(cluster) => {
                let map = cluster.slot_map().await?;
                let mut conn = cluster.conn().await?;
                let mut out = Vec::new();
                for (i, (host, port)) in map.primaries.iter().enumerate() {
                    let slot = map.first_slot_of(i).unwrap_or(0);
                    let reply = bounded(
                        limit,
                        conn.route_command(
                            command.clone(),
                            redis::cluster_routing::RoutingInfo::SingleNode(
                                crate::cluster::route_to_slot(slot),
                            ),
                        ),
                    )
                    .await?;
                    out.push((format!("{host}:{port}"), reply));
                }
                Ok(out)
            }
            _ => {
                let mut conn = self.conn().await?;
                let reply: Value = self.bounded(limit, command.query_async(&mut conn)).await?;
                let addr = match &self.link {
                    Link::Sentinel(s) => s.primary_addr().unwrap_or_else(|| self.addr.clone()),
                    _ => self.addr.clone(),
                };
                Ok(vec![(addr, reply)])
            }
        }
    }

    pub(crate) async fn acquire(
        &self,
        keys: &Keys,
        req: &AcquireRequest<'_>,
    ) -> RedisResult<AcquireReply> {
        let key = &keys.key;
        let mut cmd = evalsha(&scripts::ACQUIRE, 4, 12, 4 * key.len() + 160);
        cmd.arg(key)
            .arg(keys.fence())
            .arg(keys.queue())
            .arg(keys.queue_states());
        // The token is fresh for every attempt: it is also the attempt's nonce in the queue.
        cmd.arg(req.token)
            .arg(req.ttl_ms)
            .arg(req.fence_quantum)
            .arg(req.fence_retention_ms);
        if let Some(waiter) = req.waiter {
            let (evict, seen) = req.evict.unwrap_or(("", ""));
            cmd.arg(&waiter.id)
                .arg(waiter.grace.as_millis() as u64)
                .arg(evict)
                .arg(seen);
        }
        let sent = Instant::now();
        let wait = self.wait_cmd(req.ttl_ms);
        let (reply, acked): (Vec<Value>, _) = self
            .eval(&scripts::ACQUIRE, &cmd, wait.as_ref(), req.limit)
            .await?;
        self.rtt.record(sent.elapsed());
        let int = |v: &Value| match v {
            Value::Int(n) => Some(*n),
            _ => None,
        };
        let text = |v: Option<&Value>| v.map(value_text).unwrap_or_default();
        Ok(match reply.first().and_then(int) {
            Some(1) => match acked {
                Some(acked) if acked < self.replicas => {
                    self.undo_unreplicated(key, req.token).await;
                    AcquireReply::NotReplicated { acked }
                }
                _ => AcquireReply::Taken {
                    fence: reply.get(1).and_then(int).unwrap_or(0) as u64,
                },
            },
            Some(0) => {
                let pttl = reply.get(1).and_then(int).unwrap_or(-1);
                AcquireReply::Busy {
                    pttl: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
                }
            }
            Some(2) => AcquireReply::NotOurTurn {
                head: text(reply.get(1)),
                state: text(reply.get(2)),
            },
            Some(-1) => AcquireReply::Foreign {
                detail: format!(
                    "key `{key}` holds a {} value, not a lock; it was left untouched",
                    text(reply.get(1))
                ),
            },
            _ => AcquireReply::Foreign {
                detail: format!(
                    "fence counter `{}` is not an integer counter ({}); it was left untouched",
                    keys.fence(),
                    text(reply.get(1))
                ),
            },
        })
    }

    /// A key taken without the replicas' acknowledgement is deleted at once (compare-and-delete):
    /// a failover could lose it and let a second holder in.
    async fn undo_unreplicated(&self, key: &str, token: &str) {
        let how = Release {
            keep_ms: 0,
            always_publish: false,
            record_fence: 0,
            fence_retention_ms: 0,
        };
        if let Err(e) = self.release(key, token, &how).await {
            tracing::debug!(node = %self.addr, key, error = %e, "deleting an unacknowledged key failed; it expires by its ttl");
        }
    }

    /// The uncontended path on one server, in plain commands and one round trip: `SET NX PX GET`
    /// (which also says whether the key was free), the server's clock and the fence counter, and
    /// whether waiters queue (a lock taken from under queued waiters is handed over to them at
    /// once). The fence is `max(counter + 1, clock in µs)`, as the acquire script computes it; the
    /// counter is written at release (see [`scripts::RELEASE`]), while the key is still ours.
    /// Anything unusual (a key or counter of another type, a counter that is not a number) goes
    /// to the script (`Unclear`), which tells what it is.
    pub(crate) async fn acquire_fast(
        &self,
        keys: &Keys,
        token: &str,
        ttl_ms: u64,
        limit: Duration,
    ) -> RedisResult<FastReply> {
        let key = &keys.key;
        // Each command sized up front: no buffer grows on the way.
        let command = |args: usize, bytes: usize| redis::Cmd::with_capacity(args, bytes);
        let mut set = command(7, key.len() + token.len() + 40);
        set.arg("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .arg("GET");
        let mut time = command(1, 4);
        time.arg("TIME");
        let mut counter = command(2, key.len() + 12);
        counter.arg("GET").arg(keys.fence());
        let mut queued = command(2, key.len() + 16);
        queued.arg("EXISTS").arg(keys.queue());
        let wait = self.wait_cmd(ttl_ms);
        let mut pipe = redis::Pipeline::with_capacity(5);
        pipe.add_command(set)
            .add_command(time)
            .add_command(counter)
            .add_command(queued);
        let sent = Instant::now();
        let replies = match wait {
            None => {
                let mut conn = self.conn().await?;
                self.bounded(
                    limit,
                    pipe.query_async::<(Option<Value>, (u64, u64), Value, bool)>(&mut conn),
                )
                .await
                .map(|(a, b, c, d)| (a, b, c, d, None))
            }
            Some(wait) => {
                pipe.add_command(wait);
                let mut conn = self.conn().await?;
                self.bounded(
                    limit,
                    pipe.query_async::<(Option<Value>, (u64, u64), Value, bool, usize)>(&mut conn),
                )
                .await
                .map(|(a, b, c, d, acked)| (a, b, c, d, Some(acked)))
            }
        };
        let (previous, (secs, micros), counter, queued, acked) = match replies {
            Ok(replies) => replies,
            // The server answered, with an error (a key of another type): the script tells.
            Err(e) if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) => {
                return Ok(FastReply::Unclear { taken: true });
            }
            Err(e) => return Err(e),
        };
        self.rtt.record(sent.elapsed());
        let counter = match counter {
            Value::Nil => Some(0),
            Value::BulkString(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.parse().ok()),
            _ => None,
        };
        if previous.is_none()
            && let Some(acked) = acked
            && acked < self.replicas
        {
            self.undo_unreplicated(key, token).await;
            return Ok(FastReply::NotReplicated { acked });
        }
        Ok(match (previous, counter) {
            // Free, but waiters queue (the lock expired under them): theirs, not ours.
            (None, _) if queued => FastReply::Unclear { taken: true },
            (None, Some(last)) => FastReply::Taken {
                fence: (last + 1).max(secs * 1_000_000 + micros),
            },
            // Ours, but the counter is not a counter: the script reports it (after a release).
            (None, None) => FastReply::Unclear { taken: true },
            // Held: when it frees, the waiting path asks the script (which knows the PTTL).
            (Some(_), _) => FastReply::Busy,
        })
    }

    /// Takes `waiter` out of the lock's queue (it gave up or was cancelled), and passes on a lock
    /// that was handed to it.
    pub(crate) async fn leave_queue(&self, keys: &Keys, waiter: &str) -> RedisResult<()> {
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
        // A lock handed to this waiter meanwhile goes on to the next one (or is freed).
        let handed = format!("~{waiter}");
        let how = Release {
            keep_ms: 0,
            always_publish: false,
            record_fence: 0,
            fence_retention_ms: 0,
        };
        self.release(&keys.key, &handed, &how).await.map(|_| ())
    }

    /// Renews many leases: `(key, token, ttl_ms)` each; one reply per lease, `None` where no
    /// answer came. One script call per chunk of up to [`RENEW_CHUNK`] leases; on a Redis Cluster,
    /// one per primary and chunk (see [`Self::renew_on_cluster`]). Replicas asked for by
    /// `replicas(n)` must acknowledge the call, else every lease it renewed is `NotReplicated`.
    pub(crate) async fn renew(&self, items: &[(&str, &str, u64)]) -> Vec<Option<RenewReply>> {
        if let Some(cluster) = self.link.cluster() {
            return self.renew_on_cluster(cluster, items).await;
        }
        match self.renew_call(items).await {
            Ok(codes) => codes,
            Err(e) => {
                tracing::debug!(node = %self.addr, error = %e, leases = items.len(), "renewal failed; retrying");
                vec![None; items.len()]
            }
        }
    }

    /// One [`scripts::RENEW`] call (keys declared, so that it is routed by them).
    async fn renew_call(
        &self,
        items: &[(&str, &str, u64)],
    ) -> RedisResult<Vec<Option<RenewReply>>> {
        let bytes: usize = items.iter().map(|(k, t, _)| k.len() + t.len() + 40).sum();
        let mut cmd = evalsha(&scripts::RENEW, items.len(), 3 * items.len(), bytes);
        for (key, _, _) in items {
            cmd.arg(*key);
        }
        for (_, token, ttl_ms) in items {
            cmd.arg(*token).arg(*ttl_ms);
        }
        let wait = self.wait_cmd(min_ttl(items));
        let limit = self.settings.response_timeout;
        let (codes, acked): (Vec<i64>, Option<usize>) = self
            .eval(&scripts::RENEW, &cmd, wait.as_ref(), limit)
            .await?;
        Ok(self.renew_replies(codes, acked))
    }

    /// Renewal codes (1 renewed, 0 not ours, 2 not served here) as replies; a renewal that the
    /// replicas did not acknowledge is `NotReplicated`, one not served here has no reply.
    fn renew_replies(&self, codes: Vec<i64>, acked: Option<usize>) -> Vec<Option<RenewReply>> {
        let replicated = acked.is_none_or(|n| n >= self.replicas);
        codes
            .into_iter()
            .map(|code| match code {
                1 if replicated => Some(RenewReply::Renewed),
                1 => Some(RenewReply::NotReplicated),
                0 => Some(RenewReply::NotOwner),
                _ => None,
            })
            .collect()
    }

    /// Renewal on a Redis Cluster: the leases grouped by the primary that serves their slot (the
    /// slot map), one [`scripts::RENEW_ANY_SLOT`] call per primary and chunk, all at once, so a
    /// round costs about one call per primary however the leases spread over the slots. A lease
    /// that primary no longer serves (a resharding or a failover moved its slot) is sent again
    /// on its own, routed by its key, which follows MOVED and ASK; the slot map is then fetched
    /// again.
    async fn renew_on_cluster(
        &self,
        cluster: &ClusterLink,
        items: &[(&str, &str, u64)],
    ) -> Vec<Option<RenewReply>> {
        let groups: Vec<(u16, Vec<usize>)> = match cluster.slot_map().await {
            Ok(map) => {
                let mut by_owner: Vec<(u16, Vec<usize>)> = Vec::new();
                let mut index: std::collections::HashMap<usize, usize> = Default::default();
                for (i, (key, _, _)) in items.iter().enumerate() {
                    let slot = crate::slot::key_slot(key.as_bytes());
                    let owner = map.owner(slot).unwrap_or(usize::MAX);
                    let at = *index.entry(owner).or_insert_with(|| {
                        by_owner.push((slot, Vec::new()));
                        by_owner.len() - 1
                    });
                    by_owner[at].1.push(i);
                }
                by_owner
            }
            // No map: send everything to one primary; what it does not serve comes back below.
            Err(_) => vec![(
                crate::slot::key_slot(items.first().map_or(&b""[..], |i| i.0.as_bytes())),
                (0..items.len()).collect(),
            )],
        };
        let results = crate::fanout::join_all_values(groups.iter().map(|(slot, members)| {
            let group: Vec<(&str, &str, u64)> = members.iter().map(|&i| items[i]).collect();
            async move {
                let replies = self.renew_on_primary(cluster, *slot, &group).await;
                (members.as_slice(), replies)
            }
        }))
        .await;
        let mut out: Vec<Option<RenewReply>> = vec![None; items.len()];
        let mut elsewhere: Vec<usize> = Vec::new();
        for (chunk, result) in results {
            match result {
                Ok(codes) => {
                    for (&i, code) in chunk.iter().zip(codes) {
                        match code {
                            Some(reply) => out[i] = Some(reply),
                            None => elsewhere.push(i),
                        }
                    }
                }
                Err(e) => {
                    // Perhaps a failover: learn the slots again before the retry.
                    cluster.slot_map_is_stale();
                    tracing::debug!(node = %self.addr, error = %e, leases = chunk.len(), "renewal on a cluster primary failed; retrying");
                }
            }
        }
        if !elsewhere.is_empty() {
            cluster.slot_map_is_stale();
            let resent = crate::fanout::join_all_values(elsewhere.iter().map(|&i| {
                let item = [items[i]];
                async move { (i, self.renew_call(&item).await) }
            }))
            .await;
            for (i, result) in resent {
                if let Ok(codes) = result {
                    out[i] = codes.into_iter().next().flatten();
                }
            }
        }
        out
    }

    /// One pipeline to the cluster primary that serves `slot`: a [`scripts::RENEW_ANY_SLOT`]
    /// call per chunk of [`RENEW_CHUNK`] leases, then `WAIT` when replicas must acknowledge.
    /// A lease that primary does not serve comes back `None`.
    async fn renew_on_primary(
        &self,
        cluster: &ClusterLink,
        slot: u16,
        items: &[(&str, &str, u64)],
    ) -> RedisResult<Vec<Option<RenewReply>>> {
        let script = &scripts::RENEW_ANY_SLOT;
        let mut pipe = redis::Pipeline::with_capacity(items.len() / RENEW_CHUNK + 2);
        for chunk in items.chunks(RENEW_CHUNK) {
            let bytes: usize = chunk.iter().map(|(k, t, _)| k.len() + t.len() + 40).sum();
            let mut cmd = evalsha(script, 0, 3 * chunk.len(), bytes);
            for (key, token, ttl_ms) in chunk {
                cmd.arg(*key).arg(*token).arg(*ttl_ms);
            }
            pipe.add_command(cmd);
        }
        let calls = items.chunks(RENEW_CHUNK).len();
        let wait = self.wait_cmd(min_ttl(items));
        if let Some(wait) = wait.clone() {
            pipe.add_command(wait);
        }
        let count = calls + usize::from(wait.is_some());
        let route = crate::cluster::route_to_slot(slot);
        let mut conn = cluster.conn().await?;
        let call = async {
            let mut loaded = false;
            loop {
                let replies = conn
                    .route_pipeline(pipe.clone(), 0, count, route.clone())
                    .await?;
                let noscript = replies.iter().any(|r| {
                    matches!(r, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
                });
                if noscript && !loaded {
                    script.prepare_invoke().load_async(&mut conn).await?;
                    loaded = true;
                    continue;
                }
                return Ok(replies);
            }
        };
        let mut replies = bounded(self.settings.response_timeout, call)
            .await?
            .into_iter();
        let mut codes: Vec<i64> = Vec::with_capacity(items.len());
        for _ in 0..calls {
            let reply = replies.next().unwrap_or(Value::Nil).extract_error()?;
            codes.extend(Vec::<i64>::from_redis_value(reply)?);
        }
        let acked = match wait {
            Some(_) => Some(usize::from_redis_value(
                replies.next().unwrap_or(Value::Nil).extract_error()?,
            )?),
            None => None,
        };
        Ok(self.renew_replies(codes, acked))
    }

    /// Compare-and-delete (or keep for `keep_ms`, or hand over to the first waiter); true when
    /// the key was ours. See [`scripts::RELEASE`].
    pub(crate) async fn release(&self, key: &str, token: &str, how: &Release) -> RedisResult<bool> {
        let mut cmd = evalsha(&scripts::RELEASE, 3, 9, 3 * key.len() + token.len() + 110);
        cmd.arg(key)
            .arg(crate::keys::queue_of(key))
            .arg(crate::keys::fence_of(key))
            .arg(token)
            .arg(how.keep_ms)
            .arg(if how.always_publish { "1" } else { "0" })
            .arg(how.record_fence)
            .arg(how.fence_retention_ms)
            .arg(if self.is_cluster() {
                "SPUBLISH"
            } else {
                "PUBLISH"
            });
        let (done, _): (i64, _) = self
            .eval(
                &scripts::RELEASE,
                &cmd,
                None,
                self.settings.response_timeout,
            )
            .await?;
        if done == 1 && how.keep_ms == 0 {
            // Waiters in this process learn it now, not one message later.
            self.notifications.released_here(key);
        }
        Ok(done == 1)
    }

    pub(crate) async fn raise_fence(
        &self,
        keys: &Keys,
        fence: u64,
        retention_ms: u64,
        limit: Duration,
    ) -> RedisResult<()> {
        let mut cmd = evalsha(&scripts::RAISE_FENCE, 1, 3, keys.key.len() + 60);
        cmd.arg(keys.fence()).arg(fence).arg(retention_ms);
        let _: (i64, _) = self.eval(&scripts::RAISE_FENCE, &cmd, None, limit).await?;
        Ok(())
    }

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

    /// Up to `limit` keys matching `pattern` (SCAN, in batches of `COUNT 1000`), from every
    /// primary that holds keys of this deployment.
    pub(crate) async fn scan(&self, pattern: &str, limit: usize) -> RedisResult<Vec<String>> {
        let mut out = Vec::new();
        let scan = |cursor: u64| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            cmd
        };
        match self.link.cluster() {
            Some(cluster) => {
                let map = cluster.slot_map().await?;
                let mut conn = cluster.conn().await?;
                for primary in 0..map.primaries.len() {
                    let route = redis::cluster_routing::RoutingInfo::SingleNode(
                        crate::cluster::route_to_slot(map.first_slot_of(primary).unwrap_or(0)),
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
                        out.extend(keys);
                        if out.len() >= limit {
                            out.truncate(limit);
                            return Ok(out);
                        }
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
                Ok(out)
            }
            None => {
                let mut cursor = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = self.query(&scan(cursor)).await?;
                    out.extend(keys);
                    if next == 0 || out.len() >= limit {
                        out.truncate(limit);
                        return Ok(out);
                    }
                    cursor = next;
                }
            }
        }
    }

    /// Subscribes to a release channel of this server (see [`Notifications::subscribe`]).
    pub(crate) async fn subscribe(&self, channel: &str) -> (Subscription, RedisResult<()>) {
        self.notifications.subscribe(channel).await
    }
}

/// The shortest ttl of a batch of renewals: the one whose margin bounds its `WAIT`.
fn min_ttl(items: &[(&str, &str, u64)]) -> u64 {
    items.iter().map(|i| i.2).min().unwrap_or(0)
}

/// A URL that cannot be parsed, said with what is expected.
fn bad_url(url: &str, e: &redis::RedisError) -> LockError {
    let hint = url_hint(url, cfg!(feature = "tls"));
    LockError::config(
        "",
        format!("invalid Redis URL `{}`: {e}{hint}", redact(url)),
    )
}

/// What to do about a URL that does not parse, in a build with or without TLS support.
fn url_hint(url: &str, tls: bool) -> &'static str {
    if url.starts_with("rediss://") && !tls {
        "; this build has no TLS support: enable the `tls` feature of lock-runtime \
         (`lock-runtime = { version = \"..\", features = [\"tls\"] }`), or reach the server over \
         redis:// (e.g. through a TLS tunnel)"
    } else {
        "; expected redis://[user:password@]host:port[/db]"
    }
}

fn value_text(value: &Value) -> String {
    match value {
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::ServerError(e) => format!("{e:?}"),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tls_url_without_tls_names_the_feature() {
        let hint = super::url_hint("rediss://cache:6380", false);
        assert!(hint.contains("enable the `tls` feature"), "{hint}");
        assert!(!super::url_hint("rediss://cache:6380", true).contains("tls"));
        assert!(super::url_hint("redis:/oops", false).contains("expected redis://"));
    }
}
