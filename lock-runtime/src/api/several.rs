//! Several names at once: all or nothing, taken in one global order so that callers naming
//! overlapping sets in different orders never deadlock, and a body run under all of them.

use std::panic::resume_unwind;

use tokio::time::Instant;

use crate::api::run::CatchUnwind;
use crate::{Lease, LockError, LockOptions, Locker, LostReason};

/// How a body run under several leases ended.
enum Ending<T> {
    Done(T),
    Panicked(Box<dyn std::any::Any + Send>),
    MaxExec,
    /// The lease at this position was lost.
    Lost(usize, LostReason),
}

impl Locker {
    /// Takes every lock of `names` or none, and returns their leases in the order given. Each
    /// name has its own lease, renewal and fence.
    ///
    /// The names are taken in one global order (by key), whatever order they are given in:
    /// callers that name overlapping sets never wait for each other in a cycle. `opts.wait()`
    /// bounds the whole call: a caller never holds some of the names while waiting past it. When
    /// one name cannot be taken (busy past the wait, or an error), the ones already taken are
    /// released and that name's error is returned. Two names that make the same key are a
    /// [`LockError::Config`].
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_runtime::Locker) -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// use lock_runtime::LockOptions;
    /// let opts = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(2));
    /// let leases = locker.acquire_all(&["account:7", "account:3"], &opts).await?;
    /// println!("fences {} and {}", leases[0].fence(), leases[1].fence());
    /// for lease in leases {
    ///     lease.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        opts: &LockOptions,
    ) -> Result<Vec<Lease>, LockError> {
        let order = self.global_order(names)?;
        let until = Instant::now() + opts.wait();
        let mut taken: Vec<(usize, Lease)> = Vec::with_capacity(names.len());
        for i in order {
            let left = until.saturating_duration_since(Instant::now());
            match self.acquire(names[i].as_ref(), &opts.with_wait(left)).await {
                Ok(lease) => taken.push((i, lease)),
                Err(e) => {
                    release_all(taken.into_iter().rev().map(|(_, l)| l)).await;
                    return Err(e);
                }
            }
        }
        taken.sort_by_key(|(i, _)| *i);
        Ok(taken.into_iter().map(|(_, lease)| lease).collect())
    }

    /// Runs `body` under every lock of `names` (see [`acquire_all`](Self::acquire_all)), with
    /// their leases in the order given: cancelled at `max_exec` or when any of them is lost, and
    /// all released on every path, as [`run`](Self::run) does for one.
    pub async fn run_all<S, T, F>(
        &self,
        names: &[S],
        opts: &LockOptions,
        body: F,
    ) -> Result<T, LockError>
    where
        S: AsRef<str>,
        F: AsyncFnOnce(&[Lease]) -> T,
    {
        if opts.fail_open() {
            return Err(LockError::config(
                names.first().map_or("", AsRef::as_ref),
                "fail_open is for one name: a call over several names runs under all of them or \
                 not at all; drop fail_open",
            ));
        }
        let leases = self.acquire_all(names, opts).await?;
        run_under_all(leases, opts, body).await
    }

    /// The indices of `names` in the order their keys sort; a `Config` error for a name that is
    /// not allowed, or two that make one key.
    fn global_order<S: AsRef<str>>(&self, names: &[S]) -> Result<Vec<usize>, LockError> {
        let mut keyed = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            let name = name.as_ref();
            crate::model::keys::check_name(name, self.key_format())?;
            keyed.push((self.key_of(name), i));
        }
        keyed.sort();
        if let Some(pair) = keyed.windows(2).find(|w| w[0].0 == w[1].0) {
            let (a, b) = (names[pair[0].1].as_ref(), names[pair[1].1].as_ref());
            return Err(LockError::config(
                a,
                format!(
                    "`{a}` and `{b}` are the same lock (key `{}`): a call cannot take one lock \
                     twice; name each lock once",
                    pair[0].0
                ),
            ));
        }
        Ok(keyed.into_iter().map(|(_, i)| i).collect())
    }
}

/// Releases every lease, all at once; failures are logged and counted by each lease.
async fn release_all(leases: impl Iterator<Item = Lease>) {
    let _ = crate::plumbing::fanout::join_all_values(leases.map(Lease::release)).await;
}

/// Runs `body` while every lease of `leases` is held, then releases them all on every path.
async fn run_under_all<T, F>(
    leases: Vec<Lease>,
    opts: &LockOptions,
    body: F,
) -> Result<T, LockError>
where
    F: AsyncFnOnce(&[Lease]) -> T,
{
    for lease in &leases {
        // From here a loss cancels a body: the loss is logged so.
        (lease.state.runs_body).store(true, std::sync::atomic::Ordering::Release);
    }
    let max_exec = opts.max_exec();
    let deadline = Instant::now() + max_exec;
    let ending = {
        let mut body = std::pin::pin!(CatchUnwind::new(body(&leases)));
        loop {
            // Listening before the bounds are read: a change in between is not missed.
            let mut watches: Vec<_> = leases.iter().map(Lease::status).collect();
            if let Some(end) = must_end(&leases, deadline) {
                break end;
            }
            let valid_until = leases
                .iter()
                .map(|l| l.state.status.get().valid_until)
                .min();
            let wake = valid_until.map_or(deadline, |v| v.min(deadline));
            tokio::select! {
                biased;
                done = body.as_mut() => {
                    break match done {
                        Err(panic) => Ending::Panicked(panic),
                        Ok(v) => must_end(&leases, deadline).unwrap_or(Ending::Done(v)),
                    };
                }
                () = tokio::time::sleep_until(wake) => {}
                () = any_changed(&mut watches) => {}
            }
        }
        // The body (and its borrow of the leases) is dropped here: cancelled if not finished.
    };
    finish(leases, ending, max_exec).await
}

/// Resolves when the status of one of the leases changes.
async fn any_changed(watches: &mut [crate::state::status::StatusRx<'_>]) {
    // Every future kept across polls: dropping one would unregister its waker.
    let mut changes: Vec<_> = watches.iter_mut().map(|w| Box::pin(w.changed())).collect();
    std::future::poll_fn(|cx| {
        let ready = changes.iter_mut().any(|c| c.as_mut().poll(cx).is_ready());
        if ready {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// Why the body must end now, if it must: a lease was lost (the first by position), the
/// validity of one ran out, or `max_exec` has passed; when both bounds have, the one that came
/// first decides.
fn must_end<T>(leases: &[Lease], deadline: Instant) -> Option<Ending<T>> {
    let now = Instant::now();
    let mut earliest: Option<(usize, Instant)> = None;
    for (i, lease) in leases.iter().enumerate() {
        let status = lease.state.status.get();
        if let Some(reason) = status.lost {
            return Some(Ending::Lost(i, reason));
        }
        if earliest.is_none_or(|(_, until)| status.valid_until < until) {
            earliest = Some((i, status.valid_until));
        }
    }
    let (i, valid_until) = earliest?;
    if valid_until <= now && valid_until <= deadline {
        Some(Ending::Lost(i, LostReason::ValidityExpired))
    } else if now >= deadline {
        Some(Ending::MaxExec)
    } else {
        None
    }
}

/// The call's result from how the body ended, once every lease is released (in the background
/// after a loss: a lost key's server may not answer).
async fn finish<T>(
    leases: Vec<Lease>,
    ending: Ending<T>,
    max_exec: std::time::Duration,
) -> Result<T, LockError> {
    if let Ending::Lost(i, reason) = ending {
        let state = &leases[i].state;
        let reason = match reason {
            LostReason::ValidityExpired => state.expired_reason(),
            other => other,
        };
        state.mark_lost(reason);
        let error = state.lost_error(reason);
        drop(leases);
        return Err(error);
    }
    let name = leases
        .first()
        .map(|l| l.name().to_owned())
        .unwrap_or_default();
    if matches!(ending, Ending::MaxExec) {
        crate::plumbing::telemetry::max_exec(leases[0].state.label(), max_exec);
    }
    let releases = leases.into_iter().map(Lease::release);
    let released = crate::plumbing::fanout::join_all_values(releases).await;
    let first_lost = released
        .into_iter()
        .find_map(|r| r.err().filter(|e| matches!(e, LockError::Lost { .. })));
    match (ending, first_lost) {
        (Ending::Panicked(panic), _) => resume_unwind(panic),
        (Ending::MaxExec, _) => Err(LockError::MaxExecExceeded { name, max_exec }),
        (Ending::Done(_), Some(lost)) => Err(lost),
        (Ending::Done(v), None) => Ok(v),
        (Ending::Lost(..), _) => unreachable!("returned above"),
    }
}
