//! Taking a lock: one attempt on the deployment, and waiting for a release.

pub(crate) mod queue;
mod schedule;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::queue::{QueuePlace, StaleHeads};
use crate::acquire::schedule::{AfterError, Backoff, jitter, retry_delay};
use crate::deployment::{Acquired, Ask, Deployment, Late};
use crate::deployment::{Grant, Subscription, Wake};
use crate::hold::watchdog::{Renewing, Watchdog};
use crate::model::hold::{Held, HoldKind};
use crate::model::keys::{GRANTS_MARK, Keys};
use crate::model::waiter::Waiter;
use crate::plumbing::telemetry;
use crate::state::lease_state::{Granted, LeaseState, renew_period};
use crate::{Lease, LockError, LockOptions};

/// A wait that never ends in practice: 100 years.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Everything a locker needs to hand out leases: its deployment, its renewal schedule and the
/// queue heads it saw.
pub(crate) struct Acquirer {
    pub(crate) deployment: Arc<Deployment>,
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
    /// Taken by the plain-command path (see `Acquired::Granted`).
    plain: bool,
    /// When the request that set the key was sent (no later than the server set it).
    sent: Instant,
    /// How long the key was set for.
    set_for: Duration,
    /// What is held.
    held: Held,
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

/// One call's wait, across its attempts.
struct Wait<'a> {
    keys: Keys,
    opts: &'a LockOptions,
    /// The lock's name, moved into the lease when one is handed out.
    name: Option<String>,
    begun: Instant,
    until: Instant,
    /// The caller's place in the fair queue (one server, `wait > 0`).
    place: Option<QueuePlace>,
    /// Release notifications, from the first busy attempt on.
    subscriptions: Option<Vec<(usize, Subscription)>>,
    backoff: Backoff,
    /// The first attempt counts from `begun`.
    first_sent: Option<Instant>,
    /// Whether an attempt found the lock held (counted once per call).
    contended: bool,
    /// In the `lock_waiters` gauge while this call waits for a busy lock.
    waiting: Option<telemetry::Waiting>,
}

impl Wait<'_> {
    fn lock_name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    /// The labels of this call's events and metrics.
    fn label(&self) -> telemetry::Label<'_> {
        telemetry::Label {
            template: self.opts.template(),
            name: self.lock_name(),
            mode: self.opts.mode(),
        }
    }

    /// The answer of a wait that ran out.
    fn busy(&self) -> LockError {
        LockError::Busy {
            name: self.lock_name().to_owned(),
            waited: self.begun.elapsed(),
            wait: self.opts.wait(),
        }
    }
}

/// What one turn of the wait loop came to.
enum Turn {
    Done(Result<Lease, LockError>),
    /// Try again at once.
    Again,
    /// Held elsewhere: see [`Attempt::Busy`].
    Busy {
        retry: Option<Duration>,
        nodes: Vec<usize>,
    },
}

/// An acquire request that may have set the key and whose outcome is not settled yet. If it is
/// dropped armed (the caller's future was dropped, timed out or aborted mid-request), it sends a
/// compare-and-delete of its token to every server. Sent on the same connection right after the
/// request, it reaches the server after it: the key, if the request set it, is gone about one
/// round trip later instead of at the end of its ttl.
struct InFlight<'a> {
    deployment: &'a Arc<Deployment>,
    keys: &'a Keys,
    token: &'a str,
    /// What the token may hold: with permits, any of them; shared, a place among the holders.
    kind: HoldKind,
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
            self.deployment.forget(self.keys, self.token, self.kind);
        }
    }
}

impl Acquirer {
    pub(crate) fn new(deployment: Arc<Deployment>, suffix: String, poll: Option<Duration>) -> Self {
        // Hex digits: the release script finds the id with Lua's `%w`.
        let mut grants = String::with_capacity(16);
        crate::model::random::push_hex(&mut grants, 16);
        Self {
            watchdog: Watchdog::new(Arc::clone(&deployment)),
            deployment,
            stale_heads: StaleHeads::default(),
            waiter_suffix: format!("{suffix}{GRANTS_MARK}{grants}"),
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
        let mut wait = self.begin(key, name, opts);
        if self.contended_lately(&wait) {
            // It is listened to at once, and its first attempt queues. Boxed, as the
            // subscription in `after_busy`: only a waiter pays for its future's size.
            let subs = Box::pin(self.subscribe(&wait.keys, wait.lock_name(), wait.place.as_ref()));
            wait.subscriptions = Some(subs.await);
        }
        let result = loop {
            let (retry, nodes) = match self.turn(&mut wait).await {
                Turn::Done(result) => break result,
                Turn::Again => continue,
                Turn::Busy { retry, nodes } => (retry, nodes),
            };
            if let Some(result) = self.after_busy(&mut wait, retry, nodes).await {
                break result;
            }
        };
        self.finish(wait, result).await
    }

    /// A wait that begins now: in the fair queue when it is one server and the caller waits.
    fn begin<'a>(&self, key: String, name: String, opts: &'a LockOptions) -> Wait<'a> {
        let keys = self.deployment.keys(key);
        let place = match self.deployment.queue_node() {
            Some(node) if !opts.wait().is_zero() => Some(QueuePlace::new(
                node,
                &keys,
                &self.waiter_suffix,
                opts.kind(),
            )),
            _ => None,
        };
        let begun = Instant::now();
        Wait {
            // A wait too long for the clock to count to is a wait as long as it takes.
            until: begun
                .checked_add(opts.wait())
                .unwrap_or_else(|| begun + FOREVER),
            keys,
            opts,
            name: Some(name),
            begun,
            place,
            subscriptions: None,
            backoff: Backoff::new(),
            first_sent: Some(begun),
            contended: false,
            waiting: None,
        }
    }

    /// Whether this locker waited on the lock within the last second: its channels are still
    /// subscribed then (see `pubsub::LINGER`), so the lock was contended, and listening costs
    /// nothing.
    fn contended_lately(&self, wait: &Wait<'_>) -> bool {
        wait.place.as_ref().is_some_and(|place| {
            place.node().subscribed(|| {
                let grants = format!("{}{}", wait.keys.grant_channels(), self.grants);
                [wait.keys.channel().to_string(), grants]
            })
        })
    }

    /// One attempt, bounded, and what its outcome means for the wait. A failed request is
    /// retried as [`Backoff::after_error`] says (after its pause, within the wait).
    async fn turn(&self, wait: &mut Wait<'_>) -> Turn {
        // Only messages from now on tell something about the coming attempt.
        for (_, sub) in wait.subscriptions.iter_mut().flatten() {
            sub.rx.borrow_and_update();
        }
        // A fresh token for every attempt: it is also the attempt's nonce in the queue.
        let token = crate::model::holder::value(&self.suffix);
        // A waiter queues from its second attempt on: by then it listens for releases, and its
        // grace comes from round trips measured on this very wait. An uncontended call never
        // touches the queue.
        let waiter = match (&mut wait.place, &wait.subscriptions) {
            (Some(place), Some(_)) => Some(place.join(&token)),
            _ => None,
        };
        // Each attempt is bounded, connecting included: a server that accepts connections but
        // never answers cannot stretch the call past `wait` plus one response timeout (on
        // Redlock three: the grants, raising fences, cleaning up a failed attempt are each
        // bounded by one). On one server this is also the only bound of the plain-command
        // request.
        let bound = self.deployment.attempt_bound(wait.opts.validity());
        // One clock read: the attempt's bound and its validity count from here (the first
        // attempt's from `begun`, a few µs earlier: its validity is, if anything, shorter).
        let sent = wait.first_sent.take().unwrap_or_else(Instant::now);
        // Awaited where it is made: bound to a local first, the attempt's future would be kept
        // twice in this one.
        let outcome = self
            .deployment
            .deadlines()
            .bound(
                sent + bound,
                self.attempt(&mut wait.name, &wait.keys, token, waiter, wait.opts, sent),
            )
            .await
            .unwrap_or_else(|_| Err(self.deployment.no_reply(wait.lock_name(), bound)));
        match outcome {
            Ok(Attempt::Taken(lease)) => Turn::Done(Ok(lease)),
            Ok(Attempt::Busy { retry, nodes }) => Turn::Busy { retry, nodes },
            Ok(Attempt::Expired) => Turn::Busy {
                retry: Some(Duration::ZERO),
                nodes: Vec::new(),
            },
            Err(e) => match wait.backoff.after_error(&e, !wait.opts.wait().is_zero()) {
                AfterError::Reconnect => Turn::Again,
                AfterError::Pause(pause) => {
                    let retry_at = Instant::now() + pause + jitter(pause);
                    tokio::time::sleep_until(retry_at.min(wait.until)).await;
                    match Instant::now() >= wait.until {
                        true => Turn::Done(Err(e)),
                        false => Turn::Again,
                    }
                }
                AfterError::Fail => Turn::Done(Err(e)),
            },
        }
    }

    /// After an attempt found the lock busy: subscribes first (so that a release between the
    /// attempt and the wait is still seen), then sleeps until a release from one of the busy
    /// `nodes` or the retry time. `Some` with the answer when the wait is over or the release
    /// granted the lock to this waiter; `None` to try again.
    async fn after_busy(
        &self,
        wait: &mut Wait<'_>,
        retry: Option<Duration>,
        nodes: Vec<usize>,
    ) -> Option<Result<Lease, LockError>> {
        if !wait.contended {
            wait.contended = true;
            telemetry::contended(wait.label());
        }
        let (now, until) = (Instant::now(), wait.until);
        if wait.opts.wait().is_zero() || now >= until {
            return Some(Err(wait.busy()));
        }
        if wait.waiting.is_none() {
            wait.waiting = Some(telemetry::Waiting::start(wait.label()));
        }
        let Some(subs) = wait.subscriptions.as_mut() else {
            // Without pub/sub, the ttl timer below still wakes us.
            let subs = Box::pin(self.subscribe(&wait.keys, wait.lock_name(), wait.place.as_ref()));
            wait.subscriptions = Some(subs.await);
            return None;
        };
        let grace = wait.place.as_ref().map(|place| place.waiter.grace);
        let (after, behind_expiry) = match retry {
            // A queued waiter is back within a third of its grace after the expiry, before
            // anyone who then finds the key free could evict it.
            Some(pttl) => {
                let most = grace.map_or(Duration::MAX, |grace| grace / 3);
                (pttl + jitter(pttl).min(most), true)
            }
            None => (wait.backoff.without_ttl(), false),
        };
        let poll = self.poll.map(|poll| poll + jitter(poll));
        let retry_at = now + retry_delay(after, grace, poll, behind_expiry);
        let woke = Box::pin(async {
            tokio::select! {
                () = tokio::time::sleep_until(retry_at.min(until)) => None,
                wake = any_changed(subs, &nodes) => Some(wake),
            }
        })
        .await;
        // Granted by the release itself: ours without another round trip.
        if let (Some(Wake::Granted(grant)), Some(place)) = (&woke, &wait.place)
            && let Some(lease) =
                self.take_grant(&mut wait.name, &wait.keys, place, grant, wait.opts)
        {
            return Some(Ok(lease));
        }
        (Instant::now() >= until).then(|| Err(wait.busy()))
    }

    /// Reports the outcome, and settles the place in the queue: the acquire script removed it
    /// when we got the lock; a wait that ran out leaves now; after any other error the place's
    /// drop leaves in the background, so the caller does not wait on a server that may not
    /// answer.
    async fn finish(
        &self,
        wait: Wait<'_>,
        result: Result<Lease, LockError>,
    ) -> Result<Lease, LockError> {
        match &result {
            Ok(lease) => {
                let state = &lease.state;
                if let Some(handed) = telemetry::handed_out(wait.begun) {
                    let _ = state.handed_out.set(handed);
                }
                telemetry::acquired(state.label(), lease.fence(), wait.begun);
            }
            Err(LockError::Busy { name, waited, .. }) => {
                let template = wait.opts.template();
                let mode = wait.opts.mode();
                telemetry::busy(
                    telemetry::Label {
                        template,
                        name,
                        mode,
                    },
                    *waited,
                )
            }
            Err(_) => {}
        }
        match (&result, wait.place) {
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
        let all = self.deployment.subscribe_all(&channel, name, waiter);
        let grants = async {
            match (self.deployment.queue_node(), waiter) {
                (Some(node), Some(waiter)) => {
                    let channel = format!("{}{}", keys.grant_channels(), self.grants);
                    Some(node.subscribe(&channel, Some(waiter)).await.0)
                }
                _ => None,
            }
        };
        let (mut subs, grants) = tokio::join!(all, grants);
        subs.extend(grants.map(|sub| (0, sub)));
        subs
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
            || place.node().waits_for_replicas()
        {
            return None;
        }
        // With permits, the grant is of the permit it names; a grant of the other kind (a lock
        // of another mode handed on to this waiter) is not this caller's to hold: its next
        // attempt finds out which mode holds the name.
        let held = opts.kind().held_by_grant(grant.permit)?;
        self.stale_heads.forget(&keys.key);
        // The grant was made after that attempt reached the server, for the waiter's grace: the
        // key lives at least until `sent + grace`; the first renewal (see `hand_out`) extends it.
        let grace = place.waiter.grace;
        let valid_until = *sent + grace.saturating_sub(crate::drift_for(grace));
        let now = Instant::now();
        if now >= valid_until {
            self.deployment.forget(keys, token, opts.kind());
            return None;
        }
        // Too little of the grace is known left for the first renewal (sent half-way) to come
        // back in time over this link (the grace was set by an attempt made before the link
        // slowed): the next attempt, made at once, takes the grant over with a lease of its
        // own, valid from its own request.
        if valid_until - now < place.node().rtt() * 2 + crate::drift_for(grace) {
            return None;
        }
        let granted = Taken {
            token: token.clone(),
            fence: grant.fence,
            plain: false,
            sent: *sent,
            set_for: grace,
            held,
        };
        Some(self.hand_out(name, keys, granted, opts, Late::none(), None))
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
        // The key's expiry: the hold as a whole is bounded by `max_exec`.
        let ttl = opts.lease();
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
            kind: opts.kind(),
        };
        // Armed until the outcome is settled: dropped mid-request, it undoes what the request did.
        let in_flight = InFlight {
            deployment: &self.deployment,
            keys,
            token: &token,
            kind: opts.kind(),
            armed: true,
        };
        // A failed attempt has cleaned up after itself by the time it returns.
        let acquire = self.deployment.acquire(lock_name, keys, &ask);
        let (outcome, early) = self
            .acquire_renewing_early(acquire, lock_name, keys, &token, opts, sent)
            .await;
        let (fence, plain, granted, late, held) = match outcome {
            Ok(Acquired::Granted {
                fence,
                plain,
                nodes,
                late,
                held,
            }) => (fence, plain, nodes, late, held),
            other => {
                in_flight.settle();
                return self.not_granted(keys, other);
            }
        };
        self.stale_heads.forget(&keys.key);
        if Instant::now() >= sent + validity {
            Box::pin(self.abandon_expired(keys, &token, &held, &granted, late, validity)).await;
            in_flight.settle();
            return Ok(Attempt::Expired);
        }
        // From here on the lease releases the key on every path, including its own drop.
        in_flight.settle();
        let taken = Taken {
            token,
            fence,
            plain,
            sent,
            set_for: ttl,
            held,
        };
        Ok(Attempt::Taken(
            self.hand_out(name, keys, taken, opts, late, early),
        ))
    }

    /// Awaits `acquire` (of the lock `keys` names, for `token`, sent at `sent`). If it is still
    /// unanswered at [`Self::early_renewal_at`], the lease it would grant is renewed from then on
    /// (a renewal sent after a slow reply could come too late), and is returned with the outcome.
    async fn acquire_renewing_early<F>(
        &self,
        acquire: F,
        name: &str,
        keys: &Keys,
        token: &str,
        opts: &LockOptions,
        sent: Instant,
    ) -> (Result<Acquired, LockError>, Option<Early>)
    where
        F: Future<Output = Result<Acquired, LockError>>,
    {
        let Some(at) = self.early_renewal_at(opts, sent) else {
            return (acquire.await, None);
        };
        let mut acquire = std::pin::pin!(acquire);
        match self
            .deployment
            .deadlines()
            .bound(at, acquire.as_mut())
            .await
        {
            Ok(outcome) => (outcome, None),
            Err(_) => {
                let early = self.renew_early(name, keys, token, opts, sent);
                (acquire.await, Some(early))
            }
        }
    }

    /// Starts renewing, now, the lease that the acquire of `keys` for `token`, sent at `sent`
    /// and not answered yet, would grant.
    fn renew_early(
        &self,
        name: &str,
        keys: &Keys,
        token: &str,
        opts: &LockOptions,
        sent: Instant,
    ) -> Early {
        let taken = Taken {
            token: token.to_owned(),
            fence: 0,
            plain: false,
            sent,
            set_for: opts.lease(),
            held: Held::Key,
        };
        let state = Arc::new(LeaseState::provisional(granted(
            name.to_owned(),
            keys,
            taken,
            opts,
        )));
        let renewing = self.watchdog.register(Arc::clone(&state), Instant::now());
        Early {
            state,
            renewing: Some(renewing),
        }
    }

    /// When an acquire still unanswered starts renewing the lease it would grant: one renew
    /// period after it was sent (shortened by the round trip measured, see `renew_period`), for
    /// an exclusive hold whose attempt may last that long; `None` when the attempt ends first.
    /// (A permit's key and a shared hold's value are known only from the reply.)
    fn early_renewal_at(&self, opts: &LockOptions, sent: Instant) -> Option<Instant> {
        if !opts.kind().held_key_known_before_reply() {
            return None;
        }
        let period = renew_period(opts.lease(), opts.renew(), self.deployment.rtt());
        (period < self.deployment.attempt_bound(opts.validity())).then(|| sent + period)
    }

    /// Gives up what a grant that came too late to be of use took.
    async fn abandon_expired(
        &self,
        keys: &Keys,
        token: &str,
        held: &Held,
        granted: &[usize],
        late: Late,
        validity: Duration,
    ) {
        let limit = self.deployment.response_timeout().min(validity);
        if let Held::Shared { .. } = held {
            // A place among the holders is left by the holder's token, on its one server.
            return self.deployment.forget(keys, token, HoldKind::Shared);
        }
        let keys = held.keys(keys);
        let abandon = self
            .deployment
            .abandon(&keys, token, granted, Vec::new(), late, limit);
        abandon.await;
    }

    /// What an attempt that was not granted comes to: busy (retry after the key's ttl, or after
    /// the queue head's grace when it is not our turn), or its error.
    fn not_granted(
        &self,
        keys: &Keys,
        outcome: Result<Acquired, LockError>,
    ) -> Result<Attempt, LockError> {
        match outcome? {
            Acquired::Busy { pttl, nodes } => Ok(Attempt::Busy { retry: pttl, nodes }),
            Acquired::NotOurTurn { head, state } => {
                let retry = self.stale_heads.seen(&keys.key, head, state);
                Ok(Attempt::Busy {
                    retry: Some(retry),
                    nodes: vec![0],
                })
            }
            Acquired::Granted { .. } => unreachable!("the attempt hands out what was granted"),
        }
    }

    /// The lease of a key taken as `taken` says, renewed from now on: first one renew period
    /// after the request; a key set for less than the ttl (a grant, for the waiter's grace: at
    /// least 300 ms and four round trips) when half of what is left of that has passed, so a
    /// short hold costs no renewal and a long one is extended in time. A lease renewed `early`
    /// is renewed already.
    fn hand_out(
        &self,
        name: &mut Option<String>,
        keys: &Keys,
        taken: Taken,
        opts: &LockOptions,
        late: Late,
        early: Option<Early>,
    ) -> Lease {
        let name = name.take().unwrap_or_default();
        let (state, renewing) = match early {
            Some(early) => early.granted(taken.fence, taken.plain),
            None => {
                let first_renewal = first_renewal(&taken, opts);
                let state = Arc::new(LeaseState::new(granted(name, keys, taken, opts)));
                let renewing = self.watchdog.register(Arc::clone(&state), first_renewal);
                (state, renewing)
            }
        };
        let lease = Lease::owned(Arc::clone(&state), renewing);
        if late.has_late() {
            let deployment = Arc::clone(&self.deployment);
            tokio::spawn(async move { deployment.settle_late_grants(state, late).await });
        }
        lease
    }
}

/// When the lease of a key taken as `taken` says is first renewed (see `Acquirer::hand_out`).
fn first_renewal(taken: &Taken, opts: &LockOptions) -> Instant {
    if taken.set_for < opts.lease() {
        let set_for = taken
            .set_for
            .saturating_sub(crate::drift_for(taken.set_for));
        let now = Instant::now();
        now + (taken.sent + set_for).saturating_duration_since(now) / 2
    } else {
        taken.sent + opts.renew()
    }
}

/// What a lease of the lock `keys` names, taken as `taken` says, is made of.
fn granted(name: String, keys: &Keys, taken: Taken, opts: &LockOptions) -> Granted {
    Granted {
        name,
        lock: keys.clone(),
        token: taken.held.token(taken.token),
        held: taken.held,
        fence: taken.fence,
        plain: taken.plain,
        ttl: opts.lease(),
        set_for: taken.set_for,
        renew: opts.renew(),
        min_hold: opts.min_hold(),
        started: taken.sent,
        template: opts.template(),
    }
}

/// The lease an acquire still unanswered would grant, renewed early (see
/// `LeaseState::provisional`): the lease if the acquire is granted, discarded otherwise.
struct Early {
    state: Arc<LeaseState>,
    renewing: Option<Renewing>,
}

impl Early {
    /// The lease and its renewal, granted with `fence`.
    fn granted(mut self, fence: u64, plain: bool) -> (Arc<LeaseState>, Renewing) {
        self.state.grant(fence, plain);
        let renewing = self.renewing.take().expect("granted once");
        (Arc::clone(&self.state), renewing)
    }
}

impl Drop for Early {
    fn drop(&mut self) {
        if self.renewing.is_some() {
            // Ended before its renewal stops: a round on its way leaves it out.
            self.state.discard();
        }
    }
}

/// Resolves on a release message from one of the `busy` servers (a lock handed to another
/// waiter does not even reach this one). Messages from the others are ignored: they cannot turn
/// the next attempt into a success, and among them are the releases of this waiter's own partial
/// grants, which would otherwise wake it again and again (a busy loop for as long as someone else
/// holds the majority).
pub(crate) async fn any_changed(subs: &mut [(usize, Subscription)], busy: &[usize]) -> Wake {
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
