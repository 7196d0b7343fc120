//! Release notifications from one server: which release channels waiters listen to, and the
//! RESP3 connection that keeps the server's subscriptions in line with them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Client, PushInfo, PushKind, RedisResult, Value};
use tokio::sync::{OnceCell, oneshot, watch};
use tokio::time::Instant;

use crate::connect::{RoundTrip, Settings, bounded, manager_config};

/// The release channels one server's waiters listen to.
pub(crate) struct Notifications {
    /// `host:port`, for logs.
    addr: String,
    /// A RESP3 client: messages arrive as pushes.
    client: Client,
    settings: Settings,
    rtt: Arc<RoundTrip>,
    conn: OnceCell<ConnectionManager>,
    channels: Mutex<HashMap<String, Channel>>,
    /// Bumped on every lost connection: a SUBSCRIBE confirmed on an older one does not count.
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

/// Held while waiting for a release message; `rx` changes on every message. Dropping it (also
/// mid-SUBSCRIBE) only lowers the channel's count; the server is brought in line by
/// [`Notifications::reconcile`], which runs in a task of its own, so a cancelled waiter can never
/// leave a subscription behind.
pub(crate) struct Subscription {
    owner: Arc<Notifications>,
    channel: String,
    pub(crate) rx: watch::Receiver<u64>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let idle = {
            let mut channels = self.owner.channels.lock().expect("channels lock");
            let Some(channel) = channels.get_mut(&self.channel) else {
                return;
            };
            channel.waiters -= 1;
            channel.waiters == 0
        };
        if idle && let Ok(handle) = tokio::runtime::Handle::try_current() {
            let owner = Arc::downgrade(&self.owner);
            let channel = std::mem::take(&mut self.channel);
            handle.spawn(Notifications::reconcile(owner, channel, None));
        }
    }
}

impl Notifications {
    pub(crate) fn new(
        addr: String,
        client: Client,
        settings: Settings,
        rtt: Arc<RoundTrip>,
    ) -> Self {
        Self {
            addr,
            client,
            settings,
            rtt,
            conn: OnceCell::new(),
            channels: Mutex::default(),
            epoch: AtomicU64::new(0),
        }
    }

    /// Subscribes to a release channel. A channel that other waiters already listen to costs no
    /// round trip. The SUBSCRIBE itself is sent by [`Self::reconcile`] in a task of its own:
    /// dropping this future mid-way is harmless. The subscription is returned with the first
    /// SUBSCRIBE's outcome; after a failure it keeps being retried in the background for as long
    /// as the subscription is held.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
    ) -> (Subscription, RedisResult<()>) {
        let (rx, subscribed) = {
            let mut channels = self.channels.lock().expect("channels lock");
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
            owner: Arc::clone(self),
            channel: channel.to_owned(),
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

    /// Wakes this process's waiters on the lock `key` at once: it was just released through
    /// this server (its release message reaches the others).
    pub(crate) fn released_here(&self, key: &str) {
        let channels = self.channels.lock().expect("channels lock");
        if channels.is_empty() {
            return;
        }
        if let Some(channel) = channels.get(&crate::keys::channel_of(key).to_string()) {
            channel.tx.send_modify(|n| *n += 1);
        }
    }

    fn on_push(&self, push: &PushInfo) {
        let channels = self.channels.lock().expect("channels lock");
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
                let channels = me.channels.lock().expect("channels lock");
                match channels.get(&channel) {
                    Some(c) => Arc::clone(&c.order),
                    None => return,
                }
            };
            let guard = Arc::clone(&order).lock_owned().await;
            let (wanted, server) = {
                let channels = me.channels.lock().expect("channels lock");
                match channels.get(&channel) {
                    // The entry was removed and made again meanwhile: take its own lock.
                    Some(c) if !Arc::ptr_eq(&c.order, &order) => continue,
                    Some(c) => (c.waiters > 0, c.server),
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
                    let mut channels = me.channels.lock().expect("channels lock");
                    if channels.get(&channel).is_some_and(|c| c.waiters == 0) {
                        channels.remove(&channel);
                    }
                    return;
                }
                (false, _) => me.send_unsubscribe(&channel).await.is_err(),
            };
            drop(guard);
            if failed {
                tracing::debug!(node = %me.addr, %channel, "SUBSCRIBE or UNSUBSCRIBE failed; retrying");
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
        let mut channels = self.channels.lock().expect("channels lock");
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
        let done = match self.conn.get() {
            Some(conn) => {
                let mut conn = conn.clone();
                bounded(self.settings.response_timeout, conn.unsubscribe(channel)).await
            }
            // Never connected: nothing was ever sent.
            None => Ok(()),
        };
        if done.is_ok() {
            let mut channels = self.channels.lock().expect("channels lock");
            if let Some(c) = channels.get_mut(channel) {
                c.server = OnServer::No;
            }
        }
        done
    }

    /// After a lost connection: forget what the server had and subscribe again to what waiters
    /// want.
    fn resubscribe(owner: &Weak<Self>) {
        let Some(me) = owner.upgrade() else { return };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wanted: Vec<String> = {
            let mut channels = me.channels.lock().expect("channels lock");
            me.epoch.fetch_add(1, Ordering::SeqCst);
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
            handle.spawn(Self::reconcile(owner.clone(), channel, None));
        }
    }

    /// The RESP3 connection that receives release messages, made on first use.
    ///
    /// Subscriptions are ours to restore, not redis-rs's: a lost connection marks every channel
    /// as not subscribed and re-subscribes the ones that waiters still want, through the same
    /// ordered `reconcile` as everything else, so a reconnect can neither drop a live waiter's
    /// channel nor bring back one that nobody wants.
    async fn connection(self: &Arc<Self>) -> RedisResult<ConnectionManager> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                let owner = Arc::downgrade(self);
                let config =
                    manager_config(self.settings).set_push_sender(move |push: PushInfo| {
                        if let Some(me) = owner.upgrade() {
                            me.on_push(&push);
                            if push.kind == PushKind::Disconnection {
                                Self::resubscribe(&owner);
                            }
                        }
                        Ok::<(), std::convert::Infallible>(())
                    });
                let limit = self.settings.connect_timeout + self.settings.response_timeout;
                bounded(
                    limit,
                    ConnectionManager::new_with_config(self.client.clone(), config),
                )
                .await
            })
            .await?;
        Ok(conn.clone())
    }
}
