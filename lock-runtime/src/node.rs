//! One Redis server: its command connection, its scripts and its release notifications.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, ErrorKind, IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisResult,
    Script, ServerErrorKind, Value,
};
use tokio::sync::{OnceCell, watch};

use crate::LockError;
use crate::acquire::Keys;
use crate::scripts;

/// A queued waiter keeps its place this long after its last attempt; waiting waiters come back
/// at least three times per grace, so only a crashed or vanished waiter drops out.
pub(crate) const WAITER_GRACE: Duration = Duration::from_millis(300);

/// Connection settings shared by every node of a locker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
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
    /// Held while deciding on and sending SUBSCRIBE or UNSUBSCRIBE, so that they reach the server
    /// in the order decided: a late UNSUBSCRIBE never undoes a newer waiter's subscription.
    subscribing: tokio::sync::Mutex<()>,
}

/// Release channels this node listens to, each with a counter bumped on every message.
#[derive(Default)]
struct Notifier {
    channels: Mutex<HashMap<String, Channel>>,
}

struct Channel {
    tx: watch::Sender<u64>,
    /// Live `Subscription`s.
    waiters: usize,
    /// SUBSCRIBE confirmed and no UNSUBSCRIBE sent since.
    subscribed: bool,
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

/// Held while waiting for a release message; the last one to go unsubscribes.
pub(crate) struct Subscription {
    node: Arc<Node>,
    channel: String,
    pub(crate) rx: watch::Receiver<u64>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = self.node.notifier.channels.lock().expect("notifier lock");
        let Some(channel) = channels.get_mut(&self.channel) else {
            return;
        };
        channel.waiters -= 1;
        if channel.waiters > 0 {
            return;
        }
        if !channel.subscribed {
            channels.remove(&self.channel);
            return;
        }
        drop(channels);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let (node, name) = (Arc::clone(&self.node), std::mem::take(&mut self.channel));
            handle.spawn(async move { node.unsubscribe_if_idle(&name).await });
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
            subscribing: tokio::sync::Mutex::new(()),
        })
    }

    /// `host:port`, without credentials.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.settings.response_timeout
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
        Self::bounded(limit, redis::cmd("PING").query_async::<()>(&mut conn)).await
    }

    pub(crate) async fn acquire(
        &self,
        keys: &Keys,
        token: &str,
        ttl_ms: u64,
        waiter: &str,
        limit: Duration,
    ) -> RedisResult<AcquireReply> {
        let (key, fence_key) = (&keys.key, &keys.fence_key);
        let mut cmd = evalsha(&scripts::ACQUIRE, 4);
        cmd.arg(key)
            .arg(fence_key)
            .arg(&keys.queue)
            .arg(&keys.queue_deadlines);
        cmd.arg(token)
            .arg(ttl_ms)
            .arg(waiter)
            .arg(WAITER_GRACE.as_millis() as u64);
        let (status, value): (i64, Value) = self.eval(&scripts::ACQUIRE, &cmd, limit).await?;
        Ok(match (status, value) {
            (1, Value::Int(fence)) => AcquireReply::Taken {
                fence: fence as u64,
            },
            (0, Value::Int(pttl)) => AcquireReply::Busy {
                pttl: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
            },
            (-1, kind) => AcquireReply::Foreign {
                detail: format!(
                    "key `{key}` holds a {} value, not a lock; it was left untouched",
                    value_text(&kind)
                ),
            },
            (_, err) => AcquireReply::Foreign {
                detail: format!(
                    "fence counter `{fence_key}` is not an integer counter ({}); it was left untouched",
                    value_text(&err)
                ),
            },
        })
    }

    /// Takes `waiter` out of the lock's queue (it gave up or was cancelled).
    pub(crate) async fn leave_queue(&self, keys: &Keys, waiter: &str) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("ZREM").arg(&keys.queue).arg(waiter).ignore();
        pipe.cmd("ZREM")
            .arg(&keys.queue_deadlines)
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
        limit: Duration,
    ) -> RedisResult<()> {
        let mut cmd = evalsha(&scripts::RAISE_FENCE, 1);
        cmd.arg(fence_key).arg(fence);
        let _: i64 = self.eval(&scripts::RAISE_FENCE, &cmd, limit).await?;
        Ok(())
    }

    /// Subscribes to a release channel; the receiver changes on every release message. A channel
    /// that other waiters already listen to costs no round trip.
    pub(crate) async fn subscribe(self: &Arc<Self>, channel: &str) -> RedisResult<Subscription> {
        let rx = {
            let mut channels = self.notifier.channels.lock().expect("notifier lock");
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    tx: watch::channel(0).0,
                    waiters: 0,
                    subscribed: false,
                });
            entry.waiters += 1;
            entry.tx.subscribe()
        };
        // From here on the subscription is counted, so dropping it undoes the count.
        let sub = Subscription {
            node: Arc::clone(self),
            channel: channel.to_owned(),
            rx,
        };
        let mut conn = self.pubsub_connection().await?;
        let _order = self.subscribing.lock().await;
        if self.is_subscribed(channel) {
            return Ok(sub);
        }
        Self::bounded(self.settings.response_timeout, conn.subscribe(channel)).await?;
        if let Some(c) = self
            .notifier
            .channels
            .lock()
            .expect("notifier lock")
            .get_mut(channel)
        {
            c.subscribed = true;
        }
        Ok(sub)
    }

    fn is_subscribed(&self, channel: &str) -> bool {
        let channels = self.notifier.channels.lock().expect("notifier lock");
        channels.get(channel).is_some_and(|c| c.subscribed)
    }

    /// Sends UNSUBSCRIBE if nobody waits on `channel` any more.
    async fn unsubscribe_if_idle(&self, channel: &str) {
        let _order = self.subscribing.lock().await;
        let idle = {
            let mut channels = self.notifier.channels.lock().expect("notifier lock");
            match channels.get_mut(channel) {
                Some(c) if c.waiters == 0 => {
                    channels.remove(channel);
                    true
                }
                _ => false,
            }
        };
        if idle && let Some(conn) = self.pubsub.get() {
            let mut conn = conn.clone();
            let _ = Self::bounded(self.settings.response_timeout, conn.unsubscribe(channel)).await;
        }
    }

    /// The RESP3 connection that receives release messages, made on first use.
    async fn pubsub_connection(&self) -> RedisResult<ConnectionManager> {
        let conn = self
            .pubsub
            .get_or_try_init(|| async {
                let notifier = Arc::clone(&self.notifier);
                let config = manager_config(self.settings)
                    .set_push_sender(move |push: PushInfo| {
                        notifier.on_push(push);
                        Ok::<(), std::convert::Infallible>(())
                    })
                    .set_automatic_resubscription();
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
