//! Leader election: one caller of many leads a name at a time (a lock held for as long as it
//! leads), and watchers learn who leads.

use std::time::Duration;

use crate::deployment::Subscription;
use crate::{Lease, LockError, LockInfo, LockOptions, Locker};

/// How long one round of an unbounded campaign waits before it queues again (at the back). Long
/// enough that no campaign notices, short enough that no timer overflows.
const CAMPAIGN_ROUND: Duration = Duration::from_secs(24 * 3600);

/// How often a watcher reads who leads when no release message came, by default: a hand-over to
/// a queued campaigner, or a leader whose lease ran out, sends none to watchers.
const DEFAULT_FALLBACK: Duration = Duration::from_millis(500);

impl Locker {
    /// Waits, in arrival order behind the other campaigners, until this caller leads `name`, and
    /// returns its lease: the fence is the term (it grows with each new leader), the lease is
    /// renewed while it is held, [`Lease::lost`] resolves when leadership ends, and
    /// [`Lease::release`] resigns, handing the lead to the next campaigner at once. A leader
    /// that dies is replaced within its lease; a paused one that wakes after its lease ran out
    /// is refused by storage that checks the fence.
    ///
    /// `opts.wait()` bounds the wait (then [`LockError::Busy`]); zero waits without bound.
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_runtime::Locker) -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// use lock_runtime::LockOptions;
    /// let opts = LockOptions::new(Duration::from_secs(10));
    /// let term = locker.campaign("scheduler", &opts).await?;
    /// println!("leading, term {}", term.fence());
    /// let reason = term.lost().await; // run the scheduler until then
    /// println!("no longer leading: {reason}");
    /// # Ok(()) }
    /// ```
    pub async fn campaign(&self, name: &str, opts: &LockOptions) -> Result<Lease, LockError> {
        if !opts.wait().is_zero() {
            return self.acquire(name, opts).await;
        }
        let round = opts.with_wait(CAMPAIGN_ROUND);
        loop {
            match self.acquire(name, &round).await {
                Err(LockError::Busy { .. }) => {}
                other => return other,
            }
        }
    }

    /// A watcher of who leads `name` (see [`LeaderWatch::changed`]). Nothing is sent until it
    /// is first asked.
    pub fn observe(&self, name: &str) -> LeaderWatch {
        LeaderWatch {
            locker: self.clone(),
            name: name.to_owned(),
            fallback: DEFAULT_FALLBACK,
            seen: None,
            subscriptions: None,
        }
    }
}

/// Who leads a name, as it changes (see [`Locker::observe`]).
pub struct LeaderWatch {
    locker: Locker,
    name: String,
    fallback: Duration,
    /// The leader last returned: its token (the value of its key when that is not one this
    /// library wrote), `None` for nobody; not set before the first call.
    seen: Option<Option<String>>,
    /// Release messages of the name, from the first call on.
    subscriptions: Option<Vec<(usize, Subscription)>>,
}

impl std::fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("name", &self.name)
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

impl LeaderWatch {
    /// How often the leader is read when no release message came (default 500 ms): the longest
    /// a change made without a message to watchers (a hand-over to a queued campaigner, a leader
    /// whose lease ran out) takes to be seen.
    #[must_use]
    pub fn with_fallback(mut self, every: Duration) -> Self {
        self.fallback = every;
        self
    }

    /// The leader once it differs from the one this watcher returned last: its lock as
    /// [`Locker::inspect`] reads it (who holds it, and the term as its fence), or `None` while
    /// nobody leads. The first call returns the leader at once. Woken by the name's release
    /// messages, and reads the leader every `fallback` besides.
    pub async fn changed(&mut self) -> Result<Option<LockInfo>, LockError> {
        if self.subscriptions.is_none() {
            // An in-memory locker: the engine of the runtime this watcher runs in.
            if let Some(here) = self.locker.engine_here() {
                self.locker = here;
            }
            // Listening before the first read: a release in between is not missed.
            let deployment = &self.locker.acquirer().deployment;
            let channel = deployment.keys(self.locker.key_of(&self.name));
            let channel = channel.channel().to_string();
            self.subscriptions = Some(deployment.subscribe_all(&channel, &self.name, None).await);
        }
        loop {
            let info = self.locker.inspect(&self.name).await?;
            // Who leads, by its token: the value's waiters' mark changes as campaigners queue.
            let now = info.as_ref().map(|i| match &i.holder {
                Some(holder) => holder.token.clone(),
                None => i.value.clone(),
            });
            if self.seen.as_ref() != Some(&now) {
                self.seen = Some(now);
                return Ok(info);
            }
            let subscriptions = self.subscriptions.as_mut().expect("subscribed above");
            let all: Vec<usize> = subscriptions.iter().map(|(i, _)| *i).collect();
            let message = crate::acquire::any_changed(subscriptions, &all);
            let _ = tokio::time::timeout(self.fallback, message).await;
        }
    }
}
