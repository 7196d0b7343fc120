//! Taking a lock: one attempt on the deployment, and waiting for a release.

pub(crate) mod queue;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::queue::{QueuePlace, StaleHeads};
use crate::deployment::{Acquired, Ask, Late, Quorum};
use crate::hold::watchdog::Watchdog;
use crate::model::keys::Keys;
use crate::server::Waiter;
use crate::server::pubsub::{Grant, Subscription, Wake};
use crate::state::lease_state::{Granted, LeaseState};
use crate::{Lease, LockError, LockOptions};

/// A wait that never ends in practice: 100 years.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Everything a locker needs to hand out leases: its deployment, its renewal schedule and the
/// queue heads it saw.
pub(crate) struct Acquirer {
    pub(crate) quorum: Arc<Quorum>,
    watchdog: Watchdog,
    stale_heads: StaleHeads,
    /// Who this process is, at the end of every value it writes (see `holder`).
    suffix: String,
    /// The end of this locker's waiter ids: `suffix` and `;grants=<grants>`.
    waiter_suffix: String,
    /// This locker's grant channel id: a release that grants a lock to one of its waiters
    /// publishes on `<key>:released:<grants>`, which no other locker listens to.
    grants: String,
    /// How often a waiter also retries when releases may go unannounced (plain keys).
    poll: Option<Duration>,
}

/// A key this caller holds: under which token, with which fence, since when and for how long.
struct Taken {
    token: String,
    fence: u64,
    /// The fence counter is to be written at release (plain-command path).
    record_fence: bool,
    /// When the request that set the key was sent (no later than the server set it).
    sent: Instant,
    /// How long the key was set for.
    set_for: Duration,
}

/// The outcome of one attempt.
enum Attempt {
    Taken(Lease),
    /// Held elsewhere, or not our turn: retry after this long (when known), woken early by a
    /// release message from one of `nodes`.
    Busy {
        retry: Option<Duration>,
        nodes: Vec<usize>,
    },
    /// Granted, but the reply came after the lease's validity ended: not held.
    Expired,
}

/// An acquire request that may have set the key and whose outcome is not settled yet. If it is
/// dropped armed (the caller's future was dropped, timed out or aborted mid-request), it sends a
/// compare-and-delete of its token to every server. Sent on the same connection right after the
/// request, it reaches the server after it: the key, if the request set it, is gone about one
/// round trip later instead of at the end of its ttl.
struct InFlight<'a> {
    quorum: &'a Arc<Quorum>,
    keys: &'a Keys,
    token: &'a str,
    armed: bool,
}

impl InFlight<'_> {
    /// The outcome is settled: the lease, or `abandon`, owns what the request did.
    fn settle(mut self) {
        self.armed = false;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.armed && tokio::runtime::Handle::try_current().is_ok() {
            self.quorum.forget(self.keys, self.token);
        }
    }
}

impl Acquirer {
    pub(crate) fn new(quorum: Arc<Quorum>, suffix: String, poll: Option<Duration>) -> Self {
        // Hex digits: the release script finds the id with Lua's `%w`.
        let mut grants = String::with_capacity(16);
        crate::model::random::push_hex(&mut grants, 16);
        Self {
            watchdog: Watchdog::new(Arc::clone(&quorum)),
            quorum,
            stale_heads: StaleHeads::default(),
            waiter_suffix: format!("{suffix};grants={grants}"),
            suffix,
            grants,
            poll,
        }
    }

    /// Takes the lock `name` (key `key`), waiting up to `opts.wait` for a busy one.
    pub(crate) async fn acquire(
        &self,
        key: String,
        name: String,
        opts: &LockOptions,
    ) -> Result<Lease, LockError> {
        let keys = self.quorum.keys(key);
        // One server and a wait: queue up, so that the lock goes to waiters in arrival order.
        let mut place = match self.quorum.queue_node() {
            Some(node) if !opts.wait().is_zero() => {
                Some(QueuePlace::new(node, &keys, &self.waiter_suffix))
            }
            _ => None,
        };
        let begun = Instant::now();
        // A wait too long for the clock to count to is a wait as long as it takes.
        let wait_until = begun
            .checked_add(opts.wait())
            .unwrap_or_else(|| begun + FOREVER);
        let mut backoff = Duration::from_millis(10);
        let mut error_backoff = Duration::from_millis(5);
        // A connection found gone is tried again once, at once (see below).
        let mut reconnected = false;
        let mut name = Some(name);
        let mut first_sent = Some(begun);
        // A lock this locker waited on within the last second still has its channels
        // subscribed (see `pubsub::LINGER`): it was contended then, so this caller listens at
        // once, at no cost, and its first attempt queues, instead of a plain attempt first.
        let mut subscriptions: Option<Vec<(usize, Subscription)>> = match &place {
            Some(place)
                if place.node().subscribed(|| {
                    let channel = keys.channel();
                    [channel.to_string(), format!("{channel}:{}", self.grants)]
                }) =>
            {
                // Boxed, as the subscription below: only a waiter pays for its future's size.
                let lock_name = name.as_deref().unwrap_or_default();
                Some(Box::pin(self.subscribe(&keys, lock_name, Some(place))).await)
            }
            _ => None,
        };
        let result = loop {
            // Only messages from now on tell something about the coming attempt.
            for (_, sub) in subscriptions.iter_mut().flatten() {
                sub.rx.borrow_and_update();
            }
            // A fresh token for every attempt: it is also the attempt's nonce in the queue.
            let token = crate::model::holder::value(&self.suffix);
            // A waiter queues from its second attempt on: by then it listens for releases, and
            // its grace comes from round trips measured on this very wait. An uncontended call
            // never touches the queue.
            let waiter = match (&mut place, &subscriptions) {
                (Some(place), Some(_)) => Some(place.join(&token)),
                _ => None,
            };
            // Each attempt is bounded, connecting included: a server that accepts connections
            // but never answers cannot stretch the call past `wait` plus one response timeout
            // (on Redlock three: the grants, raising fences, cleaning up a failed attempt are
            // each bounded by one). On one server this is also the only bound of the
            // plain-command request.
            let bound = self.quorum.attempt_bound(opts.validity());
            // One clock read: the attempt's bound and its validity count from here (the first
            // attempt's from `begun`, a few µs earlier: its validity is, if anything, shorter).
            let sent = first_sent.take().unwrap_or_else(Instant::now);
            // Awaited where it is made: bound to a local first, the attempt's future would be
            // kept twice in this one.
            let outcome = match self
                .quorum
                .deadlines()
                .bound(
                    sent + bound,
                    self.attempt(&mut name, &keys, token, waiter, opts, sent),
                )
                .await
                .unwrap_or_else(|_| Err(self.no_reply(&name, bound)))
            {
                Ok(outcome) => outcome,
                // The connection was gone before the request (its runtime shut down, or the
                // server restarted) and redis-rs is making it again: one more attempt at once,
                // `wait = 0` included. The failed attempt has undone what it did.
                Err(LockError::Redis { ref source, .. })
                    if source.is_connection_dropped() && !reconnected =>
                {
                    reconnected = true;
                    continue;
                }
                // No majority this time, or the one server failed: within `wait`, try again
                // after a short, growing, jittered pause; when the wait runs out, this error is
                // the answer. With `wait = 0` it is returned at once. A bad key is never retried.
                Err(
                    e @ (LockError::QuorumUnavailable { .. }
                    | LockError::NotReplicated { .. }
                    | LockError::Redis { .. }),
                ) if !opts.wait().is_zero() => {
                    error_backoff = (error_backoff * 2).min(Duration::from_millis(200));
                    let retry_at = Instant::now() + error_backoff + jitter(error_backoff);
                    tokio::time::sleep_until(retry_at.min(wait_until)).await;
                    if Instant::now() >= wait_until {
                        break Err(e);
                    }
                    continue;
                }
                Err(e) => break Err(e),
            };
            let (retry_after, busy_nodes) = match outcome {
                Attempt::Taken(lease) => break Ok(lease),
                Attempt::Busy { retry, nodes } => (retry, nodes),
                Attempt::Expired => (Some(Duration::ZERO), Vec::new()),
            };
            let now = Instant::now();
            let busy = |name: &Option<String>| LockError::Busy {
                name: name.clone().unwrap_or_default(),
                waited: begun.elapsed(),
            };
            if opts.wait().is_zero() || now >= wait_until {
                break Err(busy(&name));
            }
            if subscriptions.is_none() {
                // Subscribe before the next try, so that a release between the try and the wait
                // is still seen. Without pub/sub, the PTTL timer below still wakes us.
                let lock_name = name.as_deref().unwrap_or_default();
                subscriptions =
                    Some(Box::pin(self.subscribe(&keys, lock_name, place.as_ref())).await);
                continue;
            }
            let mut retry_at = match retry_after {
                Some(pttl) => now + pttl + jitter(pttl),
                None => {
                    // No TTL on the key (not set by this library): back off; release messages
                    // still wake us.
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    now + backoff
                }
            };
            if let Some(place) = &place {
                // Come back within the grace, or lose the place in the queue.
                retry_at = retry_at.min(now + place.waiter.grace / 3);
            }
            if let Some(poll) = self.poll {
                // The holder may be a client that does not publish its release.
                retry_at = retry_at.min(now + poll + jitter(poll));
            }
            let subs = subscriptions.as_mut().expect("subscribed above");
            let woke = Box::pin(async {
                tokio::select! {
                    () = tokio::time::sleep_until(retry_at.min(wait_until)) => None,
                    wake = any_changed(subs, &busy_nodes) => Some(wake),
                }
            })
            .await;
            // Granted by the release itself: ours without another round trip.
            if let (Some(Wake::Granted(grant)), Some(place)) = (&woke, &place)
                && let Some(lease) = self.take_grant(&mut name, &keys, place, grant, opts)
            {
                break Ok(lease);
            }
            if Instant::now() >= wait_until {
                break Err(busy(&name));
            }
        };
        match &result {
            Ok(lease) => {
                crate::plumbing::telemetry::acquired(lease.state.label(), lease.fence(), begun);
            }
            Err(LockError::Busy { name, waited }) => crate::plumbing::telemetry::busy(
                crate::plumbing::telemetry::Label {
                    template: opts.template(),
                    name,
                },
                *waited,
            ),
            Err(_) => {}
        }
        // The place in the queue: the acquire script removed it when we got the lock; a wait
        // that ran out leaves now; after any other error the place's drop leaves in the
        // background, so the caller does not wait on a server that may not answer.
        match (&result, place) {
            (Ok(_), Some(place)) => place.taken(),
            (Err(LockError::Busy { .. }), Some(place)) => Box::pin(place.leave()).await,
            _ => {}
        }
        result
    }

    /// Listens for releases of the lock: on its channel on every node, and, for a queued waiter,
    /// on this locker's grant channel, where a release that grants it the lock says so (the
    /// other lockers' connections never see it).
    async fn subscribe(
        &self,
        keys: &Keys,
        name: &str,
        place: Option<&QueuePlace>,
    ) -> Vec<(usize, Subscription)> {
        let channel = keys.channel().to_string();
        let waiter = place.map(|p| p.waiter.id.as_str());
        let all = self.quorum.subscribe_all(&channel, name, waiter);
        let grants = async {
            match (self.quorum.queue_node(), waiter) {
                (Some(node), Some(waiter)) => {
                    let channel = format!("{channel}:{}", self.grants);
                    Some(node.subscribe(&channel, Some(waiter)).await.0)
                }
                _ => None,
            }
        };
        let (mut subs, grants) = tokio::join!(all, grants);
        subs.extend(grants.map(|sub| (0, sub)));
        subs
    }

    /// The error of an attempt that got no answer within `bound`.
    fn no_reply(&self, name: &Option<String>, bound: Duration) -> LockError {
        let name = name.as_deref().unwrap_or_default();
        let why = format!("the server accepted the connection but did not answer within {bound:?}");
        match self.quorum.nodes() {
            [node] => node.redis_error(
                name,
                redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, why)),
            ),
            nodes => LockError::QuorumUnavailable {
                name: name.to_owned(),
                got: 0,
                needed: self.quorum.needed(),
                failures: nodes
                    .iter()
                    .map(|n| (n.addr().to_owned(), why.clone()))
                    .collect(),
            },
        }
    }

    /// The lease a release granted to `place`'s last attempt, if `grant` is that (and this
    /// server's acquires need no replica acknowledgements: then the waiter's next attempt takes
    /// the grant over and waits for them). A grant whose validity ran out by now goes on to the
    /// next waiter.
    fn take_grant(
        &self,
        name: &mut Option<String>,
        keys: &Keys,
        place: &QueuePlace,
        grant: &Grant,
        opts: &LockOptions,
    ) -> Option<Lease> {
        let (token, sent) = place.last.as_ref()?;
        if grant.waiter != place.waiter.id
            || grant.token != *token
            || self.quorum.nodes()[0].waits_for_replicas()
        {
            return None;
        }
        self.stale_heads.forget(&keys.key);
        // The grant was made after that attempt reached the server, for the waiter's grace: the
        // key lives at least until `sent + grace`; the first renewal (see `hand_out`) extends it.
        let grace = place.waiter.grace;
        if Instant::now() >= *sent + grace.saturating_sub(crate::drift(grace)) {
            self.quorum.forget(keys, token);
            return None;
        }
        let granted = Taken {
            token: token.clone(),
            fence: grant.fence,
            record_fence: false,
            sent: *sent,
            set_for: grace,
        };
        Some(self.hand_out(name, keys, granted, opts, Late::none()))
    }

    async fn attempt(
        &self,
        name: &mut Option<String>,
        keys: &Keys,
        token: String,
        waiter: Option<&Waiter>,
        opts: &LockOptions,
        sent: Instant,
    ) -> Result<Attempt, LockError> {
        let ttl = opts.ttl();
        let validity = opts.validity();
        let lock_name = name.as_deref().unwrap_or_default();
        let evict = self.stale_heads.evictable(&keys.key);
        let ask = Ask {
            sent,
            token: &token,
            ttl_ms: ttl.as_millis() as u64,
            validity,
            waiter,
            evict: evict.as_ref().map(|(h, s)| (h.as_str(), s.as_str())),
            fenced: opts.fenced(),
        };
        // Armed until the outcome is settled: dropped mid-request, it undoes what the request did.
        let in_flight = InFlight {
            quorum: &self.quorum,
            keys,
            token: &token,
            armed: true,
        };
        // A failed attempt has cleaned up after itself by the time it returns.
        let (fence, record_fence, granted, late) =
            match self.quorum.acquire(lock_name, keys, &ask).await {
                Ok(Acquired::Granted {
                    fence,
                    record_fence,
                    nodes,
                    late,
                }) => (fence, record_fence, nodes, late),
                Ok(Acquired::Busy { pttl, nodes }) => {
                    in_flight.settle();
                    return Ok(Attempt::Busy { retry: pttl, nodes });
                }
                Ok(Acquired::NotOurTurn { head, state }) => {
                    in_flight.settle();
                    let retry = self.stale_heads.seen(&keys.key, head, state);
                    return Ok(Attempt::Busy {
                        retry: Some(retry),
                        nodes: vec![0],
                    });
                }
                Err(e) => {
                    in_flight.settle();
                    return Err(e);
                }
            };
        self.stale_heads.forget(&keys.key);
        if Instant::now() >= sent + validity {
            let limit = self.quorum.nodes()[0].response_timeout().min(validity);
            Box::pin(
                self.quorum
                    .abandon(keys, &token, &granted, Vec::new(), late, limit),
            )
            .await;
            in_flight.settle();
            return Ok(Attempt::Expired);
        }
        // From here on the lease releases the key on every path, including its own drop.
        in_flight.settle();
        let taken = Taken {
            token,
            fence,
            record_fence,
            sent,
            set_for: ttl,
        };
        Ok(Attempt::Taken(self.hand_out(name, keys, taken, opts, late)))
    }

    /// The lease of a key taken as `taken` says, renewed from now on: first one renew period
    /// after the request; a key set for less than the ttl (a grant, for the waiter's grace: at
    /// least 300 ms and four round trips) when half of what is left of that has passed, so a
    /// short hold costs no renewal and a long one is extended in time.
    fn hand_out(
        &self,
        name: &mut Option<String>,
        keys: &Keys,
        taken: Taken,
        opts: &LockOptions,
        late: Late,
    ) -> Lease {
        let first_renewal = if taken.set_for < opts.ttl() {
            let set_for = taken.set_for.saturating_sub(crate::drift(taken.set_for));
            let now = Instant::now();
            now + (taken.sent + set_for).saturating_duration_since(now) / 2
        } else {
            taken.sent + opts.renew()
        };
        let state = Arc::new(LeaseState::new(Granted {
            name: name.take().unwrap_or_default(),
            key: keys.key.clone(),
            token: taken.token,
            fence: taken.fence,
            record_fence: taken.record_fence,
            ttl: opts.ttl(),
            set_for: taken.set_for,
            renew: opts.renew(),
            min_hold: opts.min_hold(),
            started: taken.sent,
            template: opts.template(),
        }));
        let renewing = self.watchdog.register(Arc::clone(&state), first_renewal);
        let lease = Lease::owned(Arc::clone(&state), renewing);
        if late.has_late() {
            let quorum = Arc::clone(&self.quorum);
            tokio::spawn(async move { quorum.settle_late_grants(state, late).await });
        }
        lease
    }
}

/// Resolves on a release message from one of the `busy` servers (a lock handed to another
/// waiter does not even reach this one). Messages from the others are ignored: they cannot turn
/// the next attempt into a success, and among them are the releases of this waiter's own partial
/// grants, which would otherwise wake it again and again (a busy loop for as long as someone else
/// holds the majority).
async fn any_changed(subs: &mut [(usize, Subscription)], busy: &[usize]) -> Wake {
    let mut relevant: Vec<&mut Subscription> = subs
        .iter_mut()
        .filter(|(i, _)| busy.contains(i))
        .map(|(_, s)| s)
        .collect();
    match relevant.as_mut_slice() {
        [] => std::future::pending().await,
        [one] => one.released().await,
        many => {
            // Keep every future alive across polls: dropping one unregisters its waker.
            let mut waits: Vec<_> = many.iter_mut().map(|s| Box::pin(s.released())).collect();
            std::future::poll_fn(|cx| {
                match waits.iter_mut().find_map(|w| match w.as_mut().poll(cx) {
                    std::task::Poll::Ready(wake) => Some(wake),
                    std::task::Poll::Pending => None,
                }) {
                    Some(wake) => std::task::Poll::Ready(wake),
                    None => std::task::Poll::Pending,
                }
            })
            .await
        }
    }
}

/// Up to 5 ms + 1/20 of the wait, so waiters that saw the same PTTL do not retry in lockstep.
fn jitter(pttl: Duration) -> Duration {
    let spread = Duration::from_millis(5) + pttl / 20;
    let r = crate::model::random::up_to(spread.as_micros() as u64);
    Duration::from_micros(r)
}
