//! One Redis server: its command connection, its scripts and its release notifications.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, ErrorKind, IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisResult,
    Script, ServerErrorKind, Value,
};
use tokio::sync::{OnceCell, watch};
use tokio::time::Instant;

use crate::LockError;
use crate::keys::Keys;
use crate::scripts;

/// The least time a queued waiter keeps its place after its last attempt; a waiter adds four of
/// its node's recent round trips to it (see [`Node::waiter_grace`]) and comes back at least three
/// times per grace, so only a crashed or vanished waiter drops out, on links of any speed.
pub(crate) const MIN_WAITER_GRACE: Duration = Duration::from_millis(300);

/// Connection settings shared by every node of a locker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
}

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
}

pub(crate) struct Node {
    addr: String,
    conn: ConnectionManager,
    pubsub_client: Client,
    settings: Settings,
    notifier: Arc<Notifier>,
    pubsub: OnceCell<ConnectionManager>,
    /// A recent round trip in µs: the largest sample, decaying by 1/8 per sample.
    rtt_us: AtomicU64,
}

/// Release channels this node listens to, each with a counter bumped on every message.
#[derive(Default)]
struct Notifier {
    channels: Mutex<HashMap<String, Channel>>,
    /// Bumped on every lost pub/sub connection: a SUBSCRIBE confirmed on an older connection
    /// does not count.
    epoch: AtomicU64,
}

struct Channel {
    tx: watch::Sender<u64>,
    /// Live `Subscription`s: the channel is wanted while this is above zero.
    waiters: usize,
    /// What the server has, as far as we know.
    server: OnServer,
    /// Held while a SUBSCRIBE or UNSUBSCRIBE of this channel is decided and sent, so that they
    /// reach the server in the order decided: a late UNSUBSCRIBE never undoes a newer waiter's
    /// subscription. One per channel, so channels do not wait for each other.
    order: Arc<tokio::sync::Mutex<()>>,
}

/// Whether the server has a subscription to a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnServer {
    No,
    /// A SUBSCRIBE failed or timed out: it may or may not have been applied.
    Maybe,
    Yes,
}

impl Notifier {
    fn on_push(&self, push: PushInfo) {
        let channels = self.channels.lock().expect("notifier lock");
        match push.kind {
            PushKind::Message => {
                if let Some(Value::BulkString(name)) = push.data.first()
                    && let Ok(name) = std::str::from_utf8(name)
                    && let Some(channel) = channels.get(name)
                {
                    channel.tx.send_modify(|n| *n += 1);
                }
            }
            // A dropped connection may have lost a release message: wake everyone to retry.
            PushKind::Disconnection => {
                for channel in channels.values() {
                    channel.tx.send_modify(|n| *n += 1);
                }
            }
            _ => {}
        }
    }
}

/// Held while waiting for a release message. Dropping it (also mid-SUBSCRIBE) only lowers the
/// channel's count; the server is brought in line by [`Node::reconcile`], which runs in a task
/// of its own, so a cancelled waiter can never leave a subscription behind.
pub(crate) struct Subscription {
    node: Arc<Node>,
    channel: String,
    pub(crate) rx: watch::Receiver<u64>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let idle = {
            let mut channels = self.node.notifier.channels.lock().expect("notifier lock");
            let Some(channel) = channels.get_mut(&self.channel) else {
                return;
            };
            channel.waiters -= 1;
            channel.waiters == 0
        };
        if idle && let Ok(handle) = tokio::runtime::Handle::try_current() {
            let (node, name) = (
                Arc::downgrade(&self.node),
                std::mem::take(&mut self.channel),
            );
            handle.spawn(Node::reconcile(node, name, None));
        }
    }
}

fn manager_config(settings: Settings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(500))
}

impl Node {
    /// Parses the URL and prepares lazy connections; nothing is sent yet.
    pub(crate) fn new(
        url: &str,
        settings: Settings,
        tls_root_cert: Option<&[u8]>,
    ) -> Result<Self, LockError> {
        let bad = |e: redis::RedisError| {
            let hint = if url.starts_with("rediss://") && cfg!(not(feature = "tls")) {
                "; this build has no TLS support: reach the server over redis:// (e.g. through a TLS tunnel)"
            } else {
                "; expected redis://[user:password@]host:port[/db]"
            };
            LockError::config(
                "",
                format!("invalid Redis URL `{}`: {e}{hint}", redact(url)),
            )
        };
        let info = url.into_connection_info().map_err(bad)?;
        let addr = info.addr().to_string();
        let client = open_client(info.clone(), tls_root_cert).map_err(bad)?;
        let conn = ConnectionManager::new_lazy_with_config(client, manager_config(settings))
            .map_err(bad)?;
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let pubsub_client =
            open_client(info.set_redis_settings(resp3), tls_root_cert).map_err(bad)?;
        Ok(Self {
            addr,
            conn,
            pubsub_client,
            settings,
            notifier: Arc::default(),
            pubsub: OnceCell::new(),
            rtt_us: AtomicU64::new(0),
        })
    }

    /// `host:port`, without credentials.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.settings.response_timeout
    }

    /// A recent round trip to this node (the largest of the last few, roughly).
    pub(crate) fn rtt(&self) -> Duration {
        Duration::from_micros(self.rtt_us.load(Ordering::Relaxed))
    }

    fn record_rtt(&self, sample: Duration) {
        let sample = sample.as_micros() as u64;
        let _ = self
            .rtt_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(sample.max(old - old / 8))
            });
    }

    /// The grace a waiter on this node asks for: long enough for it to come back at least three
    /// times, whatever the link's round trip.
    pub(crate) fn waiter_grace(&self) -> Duration {
        MIN_WAITER_GRACE + self.rtt() * 4
    }

    pub(crate) fn redis_error(&self, name: &str, source: redis::RedisError) -> LockError {
        LockError::Redis {
            name: name.to_owned(),
            addr: self.addr.clone(),
            source,
        }
    }

    /// Bounds a request by `limit`; a timeout becomes an I/O timeout error.
    async fn bounded<T>(
        limit: Duration,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> RedisResult<T> {
        match tokio::time::timeout(limit, fut).await {
            Ok(res) => res,
            Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no reply within {limit:?}"),
            ))),
        }
    }

    /// Sends an EVALSHA built by [`evalsha`]; on NOSCRIPT (a new or restarted server) loads the
    /// script once and sends it again.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        cmd: &redis::Cmd,
        limit: Duration,
    ) -> RedisResult<T> {
        let mut conn = self.conn.clone();
        let call = async {
            match cmd.query_async(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script.prepare_invoke().load_async(&mut conn).await?;
                    cmd.query_async(&mut conn).await
                }
                other => other,
            }
        };
        if limit >= self.settings.response_timeout {
            // The connection already bounds each reply by the response timeout: no second timer.
            call.await
        } else {
            Self::bounded(limit, call).await
        }
    }

    pub(crate) async fn ping(&self) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        let limit = self.settings.connect_timeout + self.settings.response_timeout;
        Self::bounded(limit, redis::cmd("PING").query_async::<()>(&mut conn)).await?;
        // Once connected, one more PING measures the round trip alone.
        let sent = Instant::now();
        Self::bounded(limit, redis::cmd("PING").query_async::<()>(&mut conn)).await?;
        self.record_rtt(sent.elapsed());
        Ok(())
    }

    pub(crate) async fn acquire(
        &self,
        keys: &Keys,
        req: &AcquireRequest<'_>,
    ) -> RedisResult<AcquireReply> {
        let (key, fence_key) = (&keys.key, &keys.fence_key);
        let mut cmd = evalsha(&scripts::ACQUIRE, 4);
        cmd.arg(key)
            .arg(fence_key)
            .arg(&keys.queue)
            .arg(&keys.queue_states);
        let (waiter, grace_ms) = req
            .waiter
            .map_or(("", 0), |w| (w.id.as_str(), w.grace.as_millis() as u64));
        let (evict, seen) = req.evict.unwrap_or(("", ""));
        cmd.arg(req.token)
            .arg(req.ttl_ms)
            .arg(waiter)
            .arg(grace_ms)
            .arg(evict)
            .arg(seen)
            .arg(req.fence_quantum)
            .arg(req.fence_retention_ms)
            // The nonce of this attempt: the token is fresh for every attempt.
            .arg(req.token);
        let sent = Instant::now();
        let reply: Vec<Value> = self.eval(&scripts::ACQUIRE, &cmd, req.limit).await?;
        self.record_rtt(sent.elapsed());
        let int = |v: &Value| match v {
            Value::Int(n) => Some(*n),
            _ => None,
        };
        let text = |v: Option<&Value>| v.map(value_text).unwrap_or_default();
        Ok(match reply.first().and_then(int) {
            Some(1) => AcquireReply::Taken {
                fence: reply.get(1).and_then(int).unwrap_or(0) as u64,
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
                    "fence counter `{fence_key}` is not an integer counter ({}); it was left untouched",
                    text(reply.get(1))
                ),
            },
        })
    }

    /// Takes `waiter` out of the lock's queue (it gave up or was cancelled).
    pub(crate) async fn leave_queue(&self, keys: &Keys, waiter: &str) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("ZREM").arg(&keys.queue).arg(waiter).ignore();
        pipe.cmd("HDEL")
            .arg(&keys.queue_states)
            .arg(waiter)
            .ignore();
        Self::bounded(
            self.settings.response_timeout,
            pipe.query_async::<()>(&mut conn),
        )
        .await
    }

    /// Renews many leases in one script call: `(key, token, ttl_ms)` each; true where still ours.
    pub(crate) async fn renew(&self, items: &[(&str, &str, u64)]) -> RedisResult<Vec<bool>> {
        let mut cmd = evalsha(&scripts::RENEW, items.len());
        for (key, _, _) in items {
            cmd.arg(*key);
        }
        for (_, token, ttl_ms) in items {
            cmd.arg(*token).arg(*ttl_ms);
        }
        let out: Vec<i64> = self
            .eval(&scripts::RENEW, &cmd, self.settings.response_timeout)
            .await?;
        Ok(out.into_iter().map(|v| v == 1).collect())
    }

    /// Compare-and-delete (or compare-and-PEXPIRE to `keep_ms`); true when the key was ours.
    pub(crate) async fn release(
        &self,
        key: &str,
        token: &str,
        keep_ms: u64,
        channel: &str,
    ) -> RedisResult<bool> {
        let mut cmd = evalsha(&scripts::RELEASE, 1);
        cmd.arg(key).arg(token).arg(keep_ms).arg(channel);
        let done: i64 = self
            .eval(&scripts::RELEASE, &cmd, self.settings.response_timeout)
            .await?;
        Ok(done == 1)
    }

    pub(crate) async fn raise_fence(
        &self,
        fence_key: &str,
        fence: u64,
        retention_ms: u64,
        limit: Duration,
    ) -> RedisResult<()> {
        let mut cmd = evalsha(&scripts::RAISE_FENCE, 1);
        cmd.arg(fence_key).arg(fence).arg(retention_ms);
        let _: i64 = self.eval(&scripts::RAISE_FENCE, &cmd, limit).await?;
        Ok(())
    }

    /// Subscribes to a release channel; the receiver changes on every release message. A channel
    /// that other waiters already listen to costs no round trip. The SUBSCRIBE itself is sent by
    /// [`Node::reconcile`] in a task of its own: dropping this future mid-way is harmless. The
    /// subscription is returned with the first SUBSCRIBE's outcome; after a failure it keeps
    /// being retried in the background for as long as the subscription is held.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
    ) -> (Subscription, RedisResult<()>) {
        let (rx, subscribed) = {
            let mut channels = self.notifier.channels.lock().expect("notifier lock");
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    tx: watch::channel(0).0,
                    waiters: 0,
                    server: OnServer::No,
                    order: Arc::default(),
                });
            entry.waiters += 1;
            (entry.tx.subscribe(), entry.server == OnServer::Yes)
        };
        // From here on the subscription is counted, so dropping it undoes the count.
        let sub = Subscription {
            node: Arc::clone(self),
            channel: channel.to_owned(),
            rx,
        };
        if !subscribed {
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(Self::reconcile(
                Arc::downgrade(self),
                channel.to_owned(),
                Some(tx),
            ));
            // No answer means nobody wants the channel any more, or the node is gone.
            if let Ok(Err(e)) = rx.await {
                return (sub, Err(e));
            }
        }
        (sub, Ok(()))
    }

    /// Brings the server's subscription to `channel` in line with the waiters that want it:
    /// SUBSCRIBE while someone waits and it is not subscribed, UNSUBSCRIBE once nobody does.
    /// Runs under the channel's ordering lock, so its commands reach the server in the order
    /// decided (an entry is removed only under that lock, once nobody wants it). The
    /// first SUBSCRIBE's outcome goes to `reply`; a failed SUBSCRIBE or UNSUBSCRIBE is retried
    /// (with a growing pause) for as long as it is still wanted and the node exists, so that no
    /// subscription outlives its waiters, and none that a waiter needs stays missing, also
    /// across reconnects.
    async fn reconcile(
        node: Weak<Self>,
        channel: String,
        mut reply: Option<tokio::sync::oneshot::Sender<RedisResult<()>>>,
    ) {
        let mut pause = Duration::from_millis(50);
        loop {
            let Some(node) = node.upgrade() else { return };
            let order = {
                let channels = node.notifier.channels.lock().expect("notifier lock");
                match channels.get(&channel) {
                    Some(c) => Arc::clone(&c.order),
                    None => return,
                }
            };
            let guard = Arc::clone(&order).lock_owned().await;
            let (wanted, server) = {
                let channels = node.notifier.channels.lock().expect("notifier lock");
                match channels.get(&channel) {
                    // The entry was removed and made again meanwhile: take its own lock.
                    Some(c) if !Arc::ptr_eq(&c.order, &order) => continue,
                    Some(c) => (c.waiters > 0, c.server),
                    None => return,
                }
            };
            let order = guard;
            let failed = match (wanted, server) {
                (true, OnServer::Yes) => {
                    if let Some(reply) = reply.take() {
                        let _ = reply.send(Ok(()));
                    }
                    return;
                }
                (true, _) => {
                    let epoch = node.notifier.epoch.load(Ordering::SeqCst);
                    let result = match node.pubsub_connection().await {
                        Ok(mut conn) => {
                            let sent = Instant::now();
                            let done = Self::bounded(
                                node.settings.response_timeout,
                                conn.subscribe(&channel),
                            )
                            .await;
                            node.record_rtt(sent.elapsed());
                            done
                        }
                        Err(e) => Err(e),
                    };
                    let same_connection = node.notifier.epoch.load(Ordering::SeqCst) == epoch;
                    {
                        let mut channels = node.notifier.channels.lock().expect("notifier lock");
                        if let Some(c) = channels.get_mut(&channel) {
                            // A failed SUBSCRIBE may still have been applied: undo it later too.
                            c.server = if result.is_ok() && same_connection {
                                OnServer::Yes
                            } else {
                                OnServer::Maybe
                            };
                        }
                    }
                    let failed = result.is_err();
                    if let Some(reply) = reply.take() {
                        let _ = reply.send(result);
                    }
                    failed
                }
                (false, OnServer::No) => {
                    let mut channels = node.notifier.channels.lock().expect("notifier lock");
                    if channels.get(&channel).is_some_and(|c| c.waiters == 0) {
                        channels.remove(&channel);
                    }
                    return;
                }
                (false, _) => {
                    let done = match node.pubsub.get() {
                        Some(conn) => {
                            let mut conn = conn.clone();
                            Self::bounded(
                                node.settings.response_timeout,
                                conn.unsubscribe(&channel),
                            )
                            .await
                        }
                        // Never connected: nothing was ever sent.
                        None => Ok(()),
                    };
                    if done.is_ok() {
                        let mut channels = node.notifier.channels.lock().expect("notifier lock");
                        if let Some(c) = channels.get_mut(&channel) {
                            c.server = OnServer::No;
                        }
                    }
                    done.is_err()
                }
            };
            drop(order);
            if failed {
                tracing::debug!(node = node.addr(), %channel, "SUBSCRIBE or UNSUBSCRIBE failed; retrying");
                drop(node);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            // Loop: the wanted state may have changed meanwhile.
        }
    }

    /// After a lost pub/sub connection: forget what the server had and subscribe again to what
    /// waiters want.
    fn resubscribe(node: &Weak<Self>) {
        let Some(strong) = node.upgrade() else { return };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wanted: Vec<String> = {
            let mut channels = strong.notifier.channels.lock().expect("notifier lock");
            strong.notifier.epoch.fetch_add(1, Ordering::SeqCst);
            for c in channels.values_mut() {
                c.server = OnServer::No;
            }
            channels
                .iter()
                .filter(|(_, c)| c.waiters > 0)
                .map(|(name, _)| name.clone())
                .collect()
        };
        for channel in wanted {
            handle.spawn(Self::reconcile(node.clone(), channel, None));
        }
    }

    /// The RESP3 connection that receives release messages, made on first use.
    ///
    /// Subscriptions are ours to restore, not redis-rs's: a lost connection marks every channel
    /// as not subscribed and re-subscribes the ones that waiters still want, through the same
    /// ordered `reconcile` as everything else, so a reconnect can neither drop a live waiter's
    /// channel nor bring back one that nobody wants.
    async fn pubsub_connection(self: &Arc<Self>) -> RedisResult<ConnectionManager> {
        let conn = self
            .pubsub
            .get_or_try_init(|| async {
                let notifier = Arc::clone(&self.notifier);
                let node = Arc::downgrade(self);
                let config =
                    manager_config(self.settings).set_push_sender(move |push: PushInfo| {
                        let lost = push.kind == PushKind::Disconnection;
                        notifier.on_push(push);
                        if lost {
                            Node::resubscribe(&node);
                        }
                        Ok::<(), std::convert::Infallible>(())
                    });
                let limit = self.settings.connect_timeout + self.settings.response_timeout;
                Self::bounded(
                    limit,
                    ConnectionManager::new_with_config(self.pubsub_client.clone(), config),
                )
                .await
            })
            .await?;
        Ok(conn.clone())
    }
}

/// `EVALSHA <sha> <numkeys>`; the caller appends the keys, then the arguments. Written straight
/// into one command buffer, without `ScriptInvocation`'s copy of every argument.
fn evalsha(script: &Script, numkeys: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(numkeys);
    cmd
}

/// A client for `info`; with the `tls` feature and a root certificate, `rediss://` servers are
/// verified against that certificate instead of the system's trust store.
fn open_client(info: redis::ConnectionInfo, tls_root_cert: Option<&[u8]>) -> RedisResult<Client> {
    #[cfg(feature = "tls")]
    if let Some(root) = tls_root_cert {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root.to_vec()),
        };
        return Client::build_with_tls(info, certs);
    }
    #[cfg(not(feature = "tls"))]
    let _ = tls_root_cert;
    Client::open(info)
}

fn value_text(value: &Value) -> String {
    match value {
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::ServerError(e) => format!("{e:?}"),
        other => format!("{other:?}"),
    }
}

/// The URL with any password replaced, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}
