//! Release notifications from one server: which release channels waiters listen to, and the
//! RESP3 connection that keeps the server's subscriptions in line with them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{Client, ConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisResult, Value};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::model::keys::HANDED_MARK;
use crate::plumbing::unpoisoned::Unpoisoned;
use crate::transport::connect::{RoundTrip, Settings, bounded, manager_config};
use crate::transport::in_process::InProcess;

/// How long a channel stays subscribed after its last waiter left. A locker whose callers wait
/// on the same lock again and again (services handing one lock back and forth every few ms)
/// then subscribes once, instead of a SUBSCRIBE and an UNSUBSCRIBE of two channels per wait.
const LINGER: Duration = Duration::from_secs(1);

/// Where release notifications come from.
pub(crate) enum Source {
    /// One server, through a RESP3 client of its own.
    Direct(Client),
    /// A Redis Cluster: sharded pub/sub (`SSUBSCRIBE`) on the primary of each channel's slot,
    /// which is the slot of its lock (the channel shares the lock's hash tag).
    Cluster {
        urls: Vec<String>,
        tls_root_cert: Option<Vec<u8>>,
    },
    /// Behind Sentinel, until the primary is known (see [`Notifications::repoint`]).
    Pending,
    /// A server in this process: its messages are handed over in the process.
    InProcess(Arc<InProcess>),
}

impl Source {
    /// A RESP3 client for the server `info` describes (pushes carry the messages).
    pub(crate) fn direct(info: &ConnectionInfo, tls_root_cert: Option<&[u8]>) -> RedisResult<Self> {
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        crate::transport::connect::open_client(
            info.clone().set_redis_settings(resp3),
            tls_root_cert,
        )
        .map(Self::Direct)
    }
}

/// The connection that holds the subscriptions.
#[derive(Clone)]
enum PubConn {
    Direct(ConnectionManager),
    Cluster(ClusterConnection),
    /// The server in this process hands every message to [`Notifications::on_message`]: there
    /// is nothing to subscribe to.
    InProcess,
}

impl PubConn {
    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Self::Direct(c) => c.subscribe(channel).await,
            Self::Cluster(c) => c.ssubscribe(channel).await,
            Self::InProcess => Ok(()),
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Self::Direct(c) => c.unsubscribe(channel).await,
            Self::Cluster(c) => c.sunsubscribe(channel).await,
            Self::InProcess => Ok(()),
        }
    }
}

/// The release channels one server's waiters listen to.
pub(crate) struct Notifications {
    /// `host:port`, for logs.
    addr: String,
    /// Where the subscriptions are made (changes when Sentinel names a new primary).
    source: Mutex<Arc<Source>>,
    settings: Settings,
    rtt: Arc<RoundTrip>,
    /// The subscribing connection, made on first use; dropped when the source changes.
    conn: Mutex<Option<Live>>,
    /// One connection attempt at a time.
    connecting: tokio::sync::Mutex<()>,
    channels: Mutex<HashMap<String, Channel>>,
    /// Bumped on every lost connection: a SUBSCRIBE confirmed on an older one does not count.
    epoch: AtomicU64,
    /// Ids of `Subscription`s.
    next_listener: AtomicU64,
}

/// The subscribing connection, and whether the runtime that drives it still runs. A runtime
/// that shuts down drops the connection's driver without a word to us (no disconnection push),
/// and the server drops its subscriptions: channels we count as subscribed, lingering ones
/// above all, would then wait for messages that never come.
struct Live {
    conn: PubConn,
    /// Held by a task in the driver's runtime, dropped with it.
    runtime: Weak<()>,
    /// Ends that task when the connection is dropped.
    _stop: oneshot::Sender<()>,
}

impl Live {
    /// Wraps `conn`, made in the current runtime.
    fn new(conn: PubConn) -> Self {
        let alive = Arc::new(());
        let runtime = Arc::downgrade(&alive);
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _alive = alive;
            let _ = stopped.await;
        });
        Self {
            conn,
            runtime,
            _stop: stop,
        }
    }

    fn runs(&self) -> bool {
        self.runtime.strong_count() > 0
    }
}

/// Whom a release message wakes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Every waiter: a plain release, a lost connection, a moved slot or primary.
    #[default]
    Everyone,
    /// The lock was handed to this waiter (the message is `~<waiter id>`): only it can take it,
    /// so the others stay asleep instead of each sending an attempt that cannot succeed.
    Only(Arc<str>),
    /// The lock was granted to this waiter, under the token of its last attempt and with this
    /// fence (the message is `~<waiter id> <token> <fence>`): it holds the lock already.
    Granted(Arc<Grant>),
}

/// A lock granted by a release to the first waiter (see `scripts::RELEASE`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub waiter: String,
    pub token: String,
    pub fence: u64,
    /// The permit granted, for a lock with `permits = N`.
    pub permit: Option<u32>,
}

impl Wake {
    /// What a release message's payload says.
    pub(crate) fn of(payload: &[u8]) -> Self {
        let Some(Ok(handed)) = payload
            .strip_prefix(HANDED_MARK.as_bytes())
            .map(std::str::from_utf8)
        else {
            return Self::Everyone;
        };
        let mut parts = handed.split(' ');
        let (waiter, token, fence) = (parts.next(), parts.next(), parts.next().map(str::parse));
        let permit: Option<Result<u32, _>> = parts.next().map(str::parse);
        match (waiter, token, fence, &permit) {
            (Some(waiter), Some(token), Some(Ok(fence)), None | Some(Ok(_))) => {
                Self::Granted(Arc::new(Grant {
                    waiter: waiter.to_owned(),
                    token: token.to_owned(),
                    fence,
                    permit: permit.and_then(Result::ok),
                }))
            }
            _ => Self::Only(handed.into()),
        }
    }

    /// The waiter this wakes alone, if any.
    fn only(&self) -> Option<&str> {
        match self {
            Self::Everyone => None,
            Self::Only(waiter) => Some(waiter),
            Self::Granted(grant) => Some(&grant.waiter),
        }
    }
}

struct Channel {
    /// The live `Subscription`s: the channel is wanted while there is one.
    listeners: Vec<Listener>,
    /// What the server has, as far as we know.
    server: OnServer,
    /// Held while a SUBSCRIBE or UNSUBSCRIBE of this channel is decided and sent, so that they
    /// reach the server in the order decided: a late UNSUBSCRIBE never undoes a newer waiter's
    /// subscription. One per channel, so channels do not wait for each other.
    order: Arc<tokio::sync::Mutex<()>>,
    /// When the last listener left, while none has come since.
    idle_since: Option<Instant>,
    /// Whether a task waits to undo the subscription once it has been idle for [`LINGER`].
    lingering: bool,
}

/// One `Subscription`'s end in its channel.
struct Listener {
    id: u64,
    /// The queued waiter it belongs to; `None` (not queued): woken by every message.
    waiter: Option<Arc<str>>,
    tx: watch::Sender<Wake>,
}

impl Channel {
    /// Passes `wake` to the listeners it concerns: all, or only the waiter it names (and those
    /// not queued), so that no other waiter's task even wakes up.
    fn wake(&self, wake: Wake) {
        let only = wake.only();
        for listener in &self.listeners {
            let concerned = match (only, listener.waiter.as_deref()) {
                (Some(head), Some(waiter)) => head == waiter,
                _ => true,
            };
            if concerned {
                listener.tx.send_replace(wake.clone());
            }
        }
    }
}

/// Whether the server has a subscription to a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnServer {
    No,
    /// A SUBSCRIBE failed or timed out: it may or may not have been applied.
    Maybe,
    Yes,
}

/// Held while waiting for a release message; `rx` changes on every message that concerns its
/// waiter: one that wakes everyone, or one that hands the lock to it. Dropping it (also
/// mid-SUBSCRIBE) only takes it out of its channel; the server is brought in line by
/// [`Notifications::reconcile`], which runs in a task of its own, so a cancelled waiter can never
/// leave a subscription behind.
pub(crate) struct Subscription {
    owner: Arc<Notifications>,
    channel: String,
    id: u64,
    pub(crate) rx: watch::Receiver<Wake>,
}

impl Subscription {
    /// Resolves on the next release message for this subscription's waiter.
    pub(crate) async fn released(&mut self) -> Wake {
        if self.rx.changed().await.is_err() {
            return Wake::Everyone;
        }
        self.rx.borrow_and_update().clone()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let handle = {
            let mut channels = self.owner.channels.locked();
            let Some(channel) = channels.get_mut(&self.channel) else {
                return;
            };
            channel.listeners.retain(|l| l.id != self.id);
            if !channel.listeners.is_empty() {
                return;
            }
            // No runtime to undo it in: the channel is left to the next waiter's drop.
            let Ok(handle) = tokio::runtime::Handle::try_current() else {
                return;
            };
            channel.idle_since = Some(Instant::now());
            if std::mem::replace(&mut channel.lingering, true) {
                // The task already waiting counts from the new `idle_since`.
                return;
            }
            handle
        };
        let owner = Arc::downgrade(&self.owner);
        let channel = std::mem::take(&mut self.channel);
        handle.spawn(Notifications::linger(owner, channel));
    }
}

/// Clears its channel's `lingering` if the task holding it ends before it did (its runtime shut
/// down mid-wait): the next waiter's drop then starts a new one.
struct Lingering {
    owner: Weak<Notifications>,
    channel: String,
    armed: bool,
}

impl Drop for Lingering {
    fn drop(&mut self) {
        if self.armed
            && let Some(me) = self.owner.upgrade()
            && let Some(c) = me.channels.locked().get_mut(&self.channel)
        {
            c.lingering = false;
        }
    }
}

impl Notifications {
    pub(crate) fn new(
        addr: String,
        source: Source,
        settings: Settings,
        rtt: Arc<RoundTrip>,
    ) -> Self {
        Self {
            addr,
            source: Mutex::new(Arc::new(source)),
            settings,
            rtt,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            channels: Mutex::default(),
            epoch: AtomicU64::new(0),
            next_listener: AtomicU64::new(0),
        }
    }

    /// Subscribes to a release channel. A channel that other waiters already listen to costs no
    /// round trip. The SUBSCRIBE itself is sent by [`Self::reconcile`] in a task of its own:
    /// dropping this future mid-way is harmless. The subscription is returned with the first
    /// SUBSCRIBE's outcome; after a failure it keeps being retried in the background for as long
    /// as the subscription is held. `waiter` is the caller's place in the lock's queue, if it
    /// has one: a lock handed to another waiter does not wake it.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
        waiter: Option<&str>,
    ) -> (Subscription, RedisResult<()>) {
        let id = self.next_listener.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(Wake::Everyone);
        let subscribed = {
            let mut channels = self.channels.locked();
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    listeners: Vec::new(),
                    server: OnServer::No,
                    order: Arc::default(),
                    idle_since: None,
                    lingering: false,
                });
            entry.idle_since = None;
            entry.listeners.push(Listener {
                id,
                waiter: waiter.map(Arc::from),
                tx,
            });
            entry.server == OnServer::Yes
        };
        let subscribed = subscribed && self.connection_runs();
        // From here on the subscription is in its channel, so dropping it takes it out.
        let sub = Subscription {
            owner: Arc::clone(self),
            channel: channel.to_owned(),
            id,
            rx,
        };
        if !subscribed {
            let (tx, rx) = oneshot::channel();
            let owner = Arc::downgrade(self);
            tokio::spawn(Self::reconcile(owner, channel.to_owned(), Some(tx)));
            // No answer means nobody wants the channel any more, or the server is gone.
            if let Ok(Err(e)) = rx.await {
                return (sub, Err(e));
            }
        }
        (sub, Ok(()))
    }

    /// Whether every one of `channels` is subscribed now (wanted or lingering) on a connection
    /// whose runtime runs: subscriptions to them would cost no round trip. Made only when this
    /// server has channels at all (a locker that never waited pays a lock and no allocation).
    pub(crate) fn subscribed<const N: usize>(
        &self,
        channels: impl FnOnce() -> [String; N],
    ) -> bool {
        let on_server = {
            let subscribed = self.channels.locked();
            !subscribed.is_empty()
                && channels().iter().all(|channel| {
                    subscribed
                        .get(channel)
                        .is_some_and(|c| c.server == OnServer::Yes)
                })
        };
        on_server && self.conn.locked().as_ref().is_some_and(Live::runs)
    }

    /// Whether the subscribing connection's runtime still runs. When it does not, the
    /// connection is dropped and everything counted as subscribed is subscribed again (the
    /// channels still wanted) or forgotten.
    fn connection_runs(self: &Arc<Self>) -> bool {
        let dead = {
            let mut conn = self.conn.locked();
            match conn.as_ref() {
                Some(live) if !live.runs() => conn.take(),
                _ => None,
            }
        };
        if dead.is_none() {
            return true;
        }
        drop(dead);
        Self::resubscribe(&Arc::downgrade(self));
        false
    }

    /// Wakes this process's waiters on the lock `key` at once (`wake` says which): it was just
    /// released through this server (its release message reaches the others).
    pub(crate) fn released_here(
        &self,
        keys: &crate::model::keys::Keys<impl AsRef<str>>,
        wake: Wake,
    ) {
        let channels = self.channels.locked();
        if channels.is_empty() {
            return;
        }
        if let Some(channel) = channels.get(&keys.channel().to_string()) {
            channel.wake(wake);
        }
    }

    /// Handles one message of the server in this process.
    fn on_message(&self, name: &str, payload: &str) {
        if let Some(channel) = self.channels.locked().get(name) {
            channel.wake(Wake::of(payload.as_bytes()));
        }
    }

    /// Handles one push; returns a channel whose subscription the server dropped by itself.
    fn on_push(&self, push: &PushInfo) -> Option<String> {
        let mut channels = self.channels.locked();
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(Value::BulkString(name)) = push.data.first()
                    && let Ok(name) = std::str::from_utf8(name)
                    && let Some(channel) = channels.get(name)
                {
                    let wake = match push.data.get(1) {
                        Some(Value::BulkString(payload)) => Wake::of(payload),
                        _ => Wake::Everyone,
                    };
                    channel.wake(wake);
                }
            }
            // The server dropped a sharded subscription by itself (its slot moved to another
            // primary): wake its waiters, and subscribe again where the slot is now.
            PushKind::SUnsubscribe => {
                if let Some(Value::BulkString(name)) = push.data.first()
                    && let Ok(name) = std::str::from_utf8(name)
                    && let Some(channel) = channels.get_mut(name)
                {
                    // Also for a lingering channel: the next waiter must subscribe again.
                    channel.server = OnServer::No;
                    if !channel.listeners.is_empty() {
                        channel.wake(Wake::Everyone);
                        return Some(name.to_owned());
                    }
                }
            }
            // A dropped connection may have lost a release message: wake everyone to retry.
            PushKind::Disconnection => {
                for channel in channels.values() {
                    channel.wake(Wake::Everyone);
                }
            }
            _ => {}
        }
        None
    }

    /// Undoes `channel`'s subscription once nobody has wanted it for [`LINGER`]; returns at once
    /// when a waiter wants it again (its drop starts the next wait).
    async fn linger(owner: Weak<Self>, channel: String) {
        let mut guard = Lingering {
            owner,
            channel,
            armed: true,
        };
        loop {
            let until = {
                let Some(me) = guard.owner.upgrade() else {
                    return;
                };
                let mut channels = me.channels.locked();
                let Some(c) = channels.get_mut(&guard.channel) else {
                    return;
                };
                match c.idle_since.filter(|_| c.listeners.is_empty()) {
                    Some(since) if Instant::now() < since + LINGER => since + LINGER,
                    // Idle long enough, or wanted again: this wait is over (decided under the
                    // lock, so that a drop from now on starts a new one).
                    idle => {
                        c.lingering = false;
                        guard.armed = false;
                        if idle.is_none() {
                            return;
                        }
                        break;
                    }
                }
            };
            tokio::time::sleep_until(until).await;
        }
        let channel = std::mem::take(&mut guard.channel);
        Self::reconcile(guard.owner.clone(), channel, None).await;
    }

    /// Brings the server's subscription to `channel` in line with the waiters that want it:
    /// SUBSCRIBE while someone waits and it is not subscribed, UNSUBSCRIBE once nobody does.
    /// Runs under the channel's ordering lock, so its commands reach the server in the order
    /// decided (an entry is removed only under that lock, once nobody wants it). The first
    /// SUBSCRIBE's outcome goes to `reply`; a failed SUBSCRIBE or UNSUBSCRIBE is retried (with a
    /// growing pause) for as long as it is still wanted and the server's handle exists, so that
    /// no subscription outlives its waiters, and none that a waiter needs stays missing, also
    /// across reconnects.
    async fn reconcile(
        owner: Weak<Self>,
        channel: String,
        mut reply: Option<oneshot::Sender<RedisResult<()>>>,
    ) {
        let mut pause = Duration::from_millis(50);
        loop {
            let Some(me) = owner.upgrade() else { return };
            let order = {
                let channels = me.channels.locked();
                match channels.get(&channel) {
                    Some(c) => Arc::clone(&c.order),
                    None => return,
                }
            };
            let guard = Arc::clone(&order).lock_owned().await;
            let (wanted, server) = {
                let channels = me.channels.locked();
                match channels.get(&channel) {
                    // The entry was removed and made again meanwhile: take its own lock.
                    Some(c) if !Arc::ptr_eq(&c.order, &order) => continue,
                    Some(c) => (!c.listeners.is_empty(), c.server),
                    None => return,
                }
            };
            let failed = match (wanted, server) {
                (true, OnServer::Yes) => {
                    if let Some(reply) = reply.take() {
                        let _ = reply.send(Ok(()));
                    }
                    return;
                }
                (true, _) => {
                    let result = me.send_subscribe(&channel).await;
                    let failed = result.is_err();
                    if let Some(reply) = reply.take() {
                        let _ = reply.send(result);
                    }
                    failed
                }
                (false, OnServer::No) => {
                    let mut channels = me.channels.locked();
                    if channels
                        .get(&channel)
                        .is_some_and(|c| c.listeners.is_empty())
                    {
                        channels.remove(&channel);
                    }
                    return;
                }
                (false, _) => me.send_unsubscribe(&channel).await.is_err(),
            };
            drop(guard);
            if failed {
                tracing::debug!(target: "lock_runtime", node = %me.addr, %channel, "SUBSCRIBE or UNSUBSCRIBE failed; retrying");
                drop(me);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            // Loop: the wanted state may have changed meanwhile.
        }
    }

    /// SUBSCRIBE, and what the server now has.
    async fn send_subscribe(self: &Arc<Self>, channel: &str) -> RedisResult<()> {
        let epoch = self.epoch.load(Ordering::SeqCst);
        let result = match self.connection().await {
            Ok(mut conn) => {
                let sent = Instant::now();
                let done = bounded(self.settings.response_timeout, conn.subscribe(channel)).await;
                self.rtt.record(sent.elapsed());
                done
            }
            Err(e) => Err(e),
        };
        let same_connection = self.epoch.load(Ordering::SeqCst) == epoch;
        let mut channels = self.channels.locked();
        if let Some(c) = channels.get_mut(channel) {
            // A failed SUBSCRIBE may still have been applied: undo it later too.
            c.server = if result.is_ok() && same_connection {
                OnServer::Yes
            } else {
                OnServer::Maybe
            };
        }
        result
    }

    /// UNSUBSCRIBE, and what the server now has.
    async fn send_unsubscribe(&self, channel: &str) -> RedisResult<()> {
        let current = self.conn.locked().as_ref().map(|live| live.conn.clone());
        let done = match current {
            Some(mut conn) => {
                bounded(self.settings.response_timeout, conn.unsubscribe(channel)).await
            }
            // Not connected (never, or the source changed): nothing is subscribed there.
            None => Ok(()),
        };
        if done.is_ok() {
            let mut channels = self.channels.locked();
            if let Some(c) = channels.get_mut(channel) {
                c.server = OnServer::No;
            }
        }
        done
    }

    /// Subscribes `channel` again (the server dropped it by itself), in a task of its own.
    fn restore(owner: &Weak<Self>, channel: String) {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(Self::reconcile(owner.clone(), channel, None));
        }
    }

    /// After a lost connection: forget what the server had and subscribe again to what waiters
    /// want.
    fn resubscribe(owner: &Weak<Self>) {
        let Some(me) = owner.upgrade() else { return };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wanted: Vec<String> = {
            let mut channels = me.channels.locked();
            me.epoch.fetch_add(1, Ordering::SeqCst);
            for c in channels.values_mut() {
                c.server = OnServer::No;
            }
            channels
                .iter()
                .filter(|(_, c)| !c.listeners.is_empty())
                .map(|(name, _)| name.clone())
                .collect()
        };
        for channel in wanted {
            handle.spawn(Self::reconcile(owner.clone(), channel, None));
        }
    }

    /// The connection that receives release messages, made on first use.
    ///
    /// Subscriptions are ours to restore, not redis-rs's: a lost connection marks every channel
    /// as not subscribed and re-subscribes the ones that waiters still want, through the same
    /// ordered `reconcile` as everything else, so a reconnect can neither drop a live waiter's
    /// channel nor bring back one that nobody wants. (The cluster client also restores the
    /// sharded subscriptions it saw on its own; that is at most a duplicate SSUBSCRIBE, and
    /// unwanted channels are still unsubscribed by `reconcile`.)
    async fn connection(self: &Arc<Self>) -> RedisResult<PubConn> {
        if self.connection_runs()
            && let Some(conn) = self.live_connection()
        {
            return Ok(conn);
        }
        let _one = self.connecting.lock().await;
        if let Some(conn) = self.live_connection() {
            return Ok(conn);
        }
        let source = Arc::clone(&self.source.locked());
        let owner = Arc::downgrade(self);
        let on_push = move |push: PushInfo| {
            if let Some(me) = owner.upgrade() {
                let dropped = me.on_push(&push);
                if push.kind == PushKind::Disconnection {
                    Self::resubscribe(&owner);
                } else if let Some(channel) = dropped {
                    Self::restore(&owner, channel);
                }
            }
            Ok::<(), std::convert::Infallible>(())
        };
        let limit = self.settings.connect_timeout + self.settings.response_timeout;
        let conn = match source.as_ref() {
            Source::Direct(client) => {
                let config = manager_config(self.settings).set_push_sender(on_push);
                PubConn::Direct(
                    bounded(
                        limit,
                        ConnectionManager::new_with_config(client.clone(), config),
                    )
                    .await?,
                )
            }
            Source::Cluster {
                urls,
                tls_root_cert,
            } => {
                let client = crate::transport::cluster::client_builder(
                    urls,
                    self.settings,
                    tls_root_cert.as_deref(),
                )
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(on_push)
                .build()?;
                PubConn::Cluster(bounded(limit, client.get_async_connection()).await?)
            }
            Source::Pending => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "no primary known yet",
                )));
            }
            Source::InProcess(server) => {
                let owner = Arc::downgrade(self);
                server.listen(Box::new(move |channel, payload| {
                    if let Some(me) = owner.upgrade() {
                        me.on_message(channel, payload);
                    }
                }));
                PubConn::InProcess
            }
        };
        // Only a connection made from the source still in place is kept.
        let current = Arc::ptr_eq(&source, &self.source.locked());
        if current {
            *self.conn.locked() = Some(Live::new(conn.clone()));
        }
        Ok(conn)
    }

    /// The subscribing connection, if there is one whose runtime still runs.
    fn live_connection(&self) -> Option<PubConn> {
        self.conn
            .locked()
            .as_ref()
            .filter(|live| live.runs())
            .map(|live| live.conn.clone())
    }

    /// Moves the subscriptions to another server (Sentinel named a new primary): the old
    /// connection is dropped, every waiter is woken, and the channels still wanted are
    /// subscribed on the new one.
    pub(crate) fn repoint(self: &Arc<Self>, source: Source) {
        *self.source.locked() = Arc::new(source);
        let old = self.conn.locked().take();
        drop(old);
        {
            let channels = self.channels.locked();
            for channel in channels.values() {
                channel.wake(Wake::Everyone);
            }
        }
        Self::resubscribe(&Arc::downgrade(self));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::watch;

    use super::{Channel, Grant, Listener, OnServer, Wake};

    #[test]
    fn a_hand_over_reaches_only_its_waiter_and_those_not_queued() {
        let mut channel = Channel {
            listeners: Vec::new(),
            server: OnServer::Yes,
            order: Arc::default(),
            idle_since: None,
            lingering: false,
        };
        let mut rxs = Vec::new();
        for (id, waiter) in [(0, Some("a")), (1, Some("b")), (2, None)] {
            let (tx, rx) = watch::channel(Wake::Everyone);
            channel.listeners.push(Listener {
                id,
                waiter: waiter.map(Arc::from),
                tx,
            });
            rxs.push(rx);
        }
        let woken = |rxs: &mut Vec<watch::Receiver<Wake>>| -> Vec<bool> {
            rxs.iter_mut()
                .map(|rx| {
                    let changed = rx.has_changed().unwrap();
                    rx.borrow_and_update();
                    changed
                })
                .collect()
        };
        channel.wake(Wake::of(b"~b t 7"));
        assert_eq!(woken(&mut rxs), [false, true, true]);
        channel.wake(Wake::of(b"~a"));
        assert_eq!(woken(&mut rxs), [true, false, true]);
        channel.wake(Wake::Everyone);
        assert_eq!(woken(&mut rxs), [true, true, true]);
    }

    #[test]
    fn release_messages_say_whom_they_wake() {
        assert_eq!(Wake::of(b"3f2a;host=h;pid=1"), Wake::Everyone);
        assert_eq!(
            Wake::of(b"~w1;host=h;pid=1"),
            Wake::Only("w1;host=h;pid=1".into())
        );
        let Wake::Granted(grant) = Wake::of(b"~w1;pid=1 t9;pid=1 1764000000000001") else {
            panic!("a grant names the waiter, its token and the fence");
        };
        let want = Grant {
            waiter: "w1;pid=1".into(),
            token: "t9;pid=1".into(),
            fence: 1_764_000_000_000_001,
            permit: None,
        };
        assert_eq!(*grant, want);
        // A permit's grant names the permit.
        let Wake::Granted(permit) = Wake::of(b"~w1 t9 17 2") else {
            panic!("a permit's grant");
        };
        assert_eq!((permit.fence, permit.permit), (17, Some(2)));
        // A fence or permit that is not a number: only a wake-up for that waiter, which then asks.
        assert_eq!(Wake::of(b"~w1 t9 x"), Wake::Only("w1 t9 x".into()));
        assert_eq!(Wake::of(b"~w1 t9 17 x"), Wake::Only("w1 t9 17 x".into()));
        assert_eq!(Wake::Granted(grant).only(), Some("w1;pid=1"));
    }
}
