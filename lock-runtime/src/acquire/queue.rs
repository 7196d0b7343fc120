//! The fair waiter queue of one server: a waiter's place in it, the grace it asks for, and the
//! heads that stopped coming back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::deployment::Node;
use crate::model::hold::HoldKind;
use crate::model::keys::Keys;
use crate::model::waiter::Waiter;
use crate::plumbing::unpoisoned::Unpoisoned;

/// The least time a queued waiter keeps its place after its last attempt; a waiter adds four of
/// its server's recent round trips to it and comes back at least three times per grace where it
/// could be evicted (behind a key without an expiry, or in front of a free one) and once per
/// grace behind a key that expires (see `schedule::retry_delay`), so only a crashed or vanished
/// waiter drops out, on links of any speed.
pub(crate) const MIN_WAITER_GRACE: Duration = Duration::from_millis(300);

/// The grace a waiter on `node` asks for.
pub(crate) fn waiter_grace(node: &Node) -> Duration {
    MIN_WAITER_GRACE + node.rtt() * 4
}

/// A place in the lock's waiter queue; leaves it when the wait ends without the lock, also when
/// the waiting future is dropped.
pub(crate) struct QueuePlace {
    node: Arc<Node>,
    keys: Keys,
    pub(crate) waiter: Waiter,
    /// Possibly in the queue (the acquire script removes a waiter that got in).
    queued: bool,
    /// The token of this waiter's last attempt and when it was sent: a release may grant the
    /// lock to it (see `scripts::RELEASE`).
    pub(crate) last: Option<(String, Instant)>,
    /// What the waiter waits for: with permits, a release hands one of the permits' keys over.
    kind: HoldKind,
}

impl QueuePlace {
    pub(crate) fn new(node: &Arc<Node>, keys: &Keys, suffix: &str, kind: HoldKind) -> Self {
        Self {
            node: Arc::clone(node),
            keys: keys.clone(),
            waiter: Waiter {
                id: crate::model::holder::value(suffix),
                grace: waiter_grace(node),
                previous: String::new(),
            },
            queued: false,
            last: None,
            kind,
        }
    }

    /// The server this place is on.
    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The waiter for the next attempt, under `token`, which may put it in the queue; a link
    /// that got slower asks for a longer grace from now on.
    pub(crate) fn join(&mut self, token: &str) -> &Waiter {
        self.queued = true;
        self.waiter.grace = self.waiter.grace.max(waiter_grace(&self.node));
        let previous = self.last.replace((token.to_owned(), Instant::now()));
        self.waiter.previous = previous.map(|(t, _)| t).unwrap_or_default();
        &self.waiter
    }

    /// Leaves the queue now (the wait ran out), passing on a lock granted to it meanwhile.
    pub(crate) async fn leave(mut self) {
        if let Some(leaving) = self.leaving() {
            leaving.await;
        }
    }

    /// Taking this place out of the queue, if it may be in it: also passes on a lock granted to
    /// its last attempt, or to the one before (the last may never have been sent).
    fn leaving(&mut self) -> Option<impl Future<Output = ()> + use<>> {
        if !std::mem::take(&mut self.queued) {
            return None;
        }
        let (node, keys) = (Arc::clone(&self.node), self.keys.clone());
        let waiter = std::mem::take(&mut self.waiter.id);
        let previous = std::mem::take(&mut self.waiter.previous);
        let last = self.last.take().map(|(token, _)| token);
        let kind = self.kind;
        Some(async move {
            if let HoldKind::Permits(n) = kind {
                // A permit granted to this waiter's last attempts is freed for the next one.
                let _ = node.leave_queue(&keys, &waiter, [None, None]).await;
                for token in [last.as_deref(), Some(previous.as_str())]
                    .into_iter()
                    .flatten()
                {
                    if !token.is_empty() {
                        let _ = node.forget_permit(&keys, n, token).await;
                    }
                }
                return;
            }
            let previous = Some(previous.as_str()).filter(|p| !p.is_empty());
            let _ = node
                .leave_queue(&keys, &waiter, [last.as_deref(), previous])
                .await;
        })
    }

    /// Taken: the acquire script already removed us.
    pub(crate) fn taken(mut self) {
        self.queued = false;
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if let Ok(handle) = tokio::runtime::Handle::try_current()
            && let Some(leaving) = self.leaving()
        {
            handle.spawn(leaving);
        }
    }
}

/// Queue heads this locker saw in front of a free lock, per key, with when it first saw each
/// one in that state. A head whose state stays the same for longer than its grace, on this
/// process's monotonic clock, has stopped coming back: the next attempt asks the server to evict
/// it (which it does only if the state is still the one seen). No server clock is involved, so
/// a server clock step cannot keep a vanished waiter's place alive.
#[derive(Default)]
pub(crate) struct StaleHeads {
    seen: Mutex<HashMap<String, Seen>>,
    /// Whether `seen` may hold anything: the common path (no queue) then takes no lock.
    any: std::sync::atomic::AtomicBool,
}

struct Seen {
    head: String,
    state: String,
    since: Instant,
    grace: Duration,
}

/// Entries kept at most; past that the map starts over (it only ever delays an eviction).
const STALE_HEADS_MAX: usize = 4096;

impl StaleHeads {
    /// Records that `head` was first in line for `key` with `state`; returns how long until it
    /// may be evicted if it does not come back.
    pub(crate) fn seen(&self, key: &str, head: String, state: String) -> Duration {
        let now = Instant::now();
        let mut seen = self.seen.locked();
        if let Some(s) = seen.get(key)
            && s.head == head
            && s.state == state
        {
            return (s.since + s.grace).saturating_duration_since(now);
        }
        if seen.len() >= STALE_HEADS_MAX {
            seen.clear();
        }
        self.any.store(true, std::sync::atomic::Ordering::Relaxed);
        // The state is "<nonce> <grace ms>"; an unreadable one gets the least grace.
        let grace = state
            .rsplit(' ')
            .next()
            .and_then(|ms| ms.parse().ok())
            .map_or(MIN_WAITER_GRACE, Duration::from_millis);
        let since = now;
        seen.insert(
            key.to_owned(),
            Seen {
                head,
                state,
                since,
                grace,
            },
        );
        grace
    }

    /// The head to evict for `key`, with the state it was seen in, if it outstayed its grace.
    pub(crate) fn evictable(&self, key: &str) -> Option<(String, String)> {
        if !self.any.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let seen = self.seen.locked();
        let s = seen.get(key)?;
        (Instant::now() >= s.since + s.grace).then(|| (s.head.clone(), s.state.clone()))
    }

    pub(crate) fn forget(&self, key: &str) {
        if !self.any.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut seen = self.seen.locked();
        seen.remove(key);
        if seen.is_empty() {
            self.any.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use lock_testing::RedisServer;

    use super::QueuePlace;
    use crate::model::keys::Keys;
    use crate::model::waiter::Waiter;
    use crate::server::{AcquireReply, AcquireRequest, Node};
    use crate::transport::connect::Settings;

    async fn attempt(
        node: &Node,
        keys: &Keys,
        token: &str,
        waiter: Option<&Waiter>,
    ) -> AcquireReply {
        let req = AcquireRequest {
            token,
            ttl_ms: 60_000,
            waiter,
            evict: None,
            fence_quantum: 1,
            fence_retention_ms: 0,
            limit: Duration::from_secs(2),
            queue: true,
        };
        node.acquire(keys, &req).await.unwrap()
    }

    /// A waiter cut off just as its next attempt began (redis-rs then never sends that request)
    /// may have been granted the lock on its previous attempt: leaving the queue passes on a lock
    /// granted to either token, so the lock is not held up for the waiter's whole grace.
    #[tokio::test]
    async fn a_cancelled_waiter_passes_on_a_lock_granted_to_an_earlier_attempt() {
        let server = RedisServer::start();
        let settings = Settings {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            require_noeviction: false,
        };
        let node =
            Arc::new(Node::direct(&server.url(), settings, None, 0, Default::default()).unwrap());
        let keys = Keys::new("lock:{q}".to_owned(), crate::KeyFormat::HashTagged);
        let suffix = crate::model::holder::suffix(None);
        let holder = crate::model::holder::value(&suffix);
        assert!(matches!(
            attempt(&node, &keys, &holder, None).await,
            AcquireReply::Taken { .. }
        ));
        let mut place = QueuePlace::new(
            &node,
            &keys,
            &format!("{suffix};grants=00"),
            crate::model::hold::HoldKind::Exclusive,
        );
        // A long grace: a grant left behind would stay for a minute, not expire under the test.
        place.waiter.grace = Duration::from_secs(60);
        let first = crate::model::holder::value(&suffix);
        let waiter = place.join(&first).clone();
        assert!(matches!(
            attempt(&node, &keys, &first, Some(&waiter)).await,
            AcquireReply::Busy { .. }
        ));
        // The next attempt is made but never reaches the server.
        let _ = place.join(&crate::model::holder::value(&suffix));
        assert!(node.release(&keys, &holder, &node.undo()).await.unwrap());
        let client = redis::Client::open(server.url()).unwrap();
        let mut raw = client.get_multiplexed_async_connection().await.unwrap();
        let value: Option<String> = redis::cmd("GET")
            .arg(&keys.key)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(
            value.as_deref(),
            Some(first.as_str()),
            "granted to the attempt that arrived"
        );
        // The waiter's future is dropped: its place leaves in the background.
        drop(place);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let value: Option<String> = redis::cmd("GET")
                .arg(&keys.key)
                .query_async(&mut raw)
                .await
                .unwrap();
            if value.is_none() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lock granted to the cancelled waiter is still held: {value:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let queued: usize = redis::cmd("ZCARD")
            .arg(keys.queue())
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(queued, 0);
    }
}
