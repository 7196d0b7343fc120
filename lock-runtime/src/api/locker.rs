//! `Locker`: the handle users hold, and the one code path of every locked call.

use std::sync::Arc;

use crate::acquire::Acquirer;
use crate::api::per_runtime::PerRuntime;
use crate::model::hold::HoldKind;
use crate::model::keys::{KeyFormat, Keys, check_name};
use crate::plumbing::telemetry;
use crate::{Lease, LockError, LockOptions};

/// Takes, renews and releases locks on one Redis node, or on N independent nodes (Redlock).
/// Cheap to clone: clones share connections and the renewal watchdog.
#[derive(Clone)]
pub struct Locker {
    inner: Arc<Inner>,
}

struct Inner {
    acquirer: Acquirer,
    /// An in-memory locker's engine of each runtime (see `Locker::in_memory`): its calls go
    /// there, not to `acquirer` (which serves only calls made outside any runtime).
    engines: Option<PerRuntime>,
    prefix: String,
    format: KeyFormat,
    /// The deployment in a few words (see `Target::describe`), for the log.
    described: String,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes = self.inner.acquirer.deployment.nodes();
        let addrs: Vec<&str> = nodes.iter().map(|n| n.addr()).collect();
        f.debug_struct("Locker")
            .field("nodes", &addrs)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

impl Locker {
    pub(crate) fn new(
        acquirer: Acquirer,
        prefix: String,
        format: KeyFormat,
        described: String,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                acquirer,
                prefix,
                format,
                described,
                engines: None,
            }),
        }
    }

    /// This locker, whose calls go to the engine of their runtime in `engines`.
    pub(crate) fn with_engines(self, engines: PerRuntime) -> Self {
        let inner = Arc::into_inner(self.inner).expect("a locker just built has no clone");
        Self {
            inner: Arc::new(Inner {
                engines: Some(engines),
                ..inner
            }),
        }
    }

    /// For an in-memory locker, the engine of the caller's runtime (see `PerRuntime`); `None`
    /// for every other locker, whose calls go to its own engine.
    pub(crate) fn engine_here(&self) -> Option<Locker> {
        self.inner.engines.as_ref()?.here()
    }

    /// The deployment in a few words: its kind and its URLs, without credentials.
    pub(crate) fn described(&self) -> &str {
        &self.inner.described
    }

    /// How names become keys.
    pub fn key_format(&self) -> KeyFormat {
        self.inner.format
    }

    pub(crate) fn acquirer(&self) -> &Acquirer {
        &self.inner.acquirer
    }

    /// An identity shared by this locker's clones (for nested calls).
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// How many servers must grant a lock: 1 on one server, a Redis Cluster or Sentinel's
    /// primary; a majority `N/2 + 1` of Redlock's N.
    pub fn grants_needed(&self) -> usize {
        self.inner.acquirer.deployment.needed()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key of the lock `name`.
    pub fn key_of(&self, name: &str) -> String {
        self.inner.format.key(&self.inner.prefix, name)
    }

    /// PINGs every node (all at once); fails unless a majority answers.
    pub async fn check_connection(&self) -> Result<(), LockError> {
        if let Some(here) = self.engine_here() {
            return Box::pin(here.check_connection()).await;
        }
        self.inner.acquirer.deployment.check().await
    }

    /// Takes the lock `name`, waiting up to `opts.wait` for a busy one. The lease is renewed in the
    /// background until it is released or dropped.
    ///
    /// Waiting is woken by the holder's release message. On one node waiters are served in
    /// arrival order: they queue in `<key>:waiters`, a free lock goes to the first of them, and a
    /// waiter that stops coming back loses its place once it outstays its grace (300 ms plus four
    /// round trips of its link).
    ///
    /// Inside a [`run`](Self::run) body (or a `#[distributed_lock]` function) that holds `name`
    /// through this locker, the lease already held is returned at once; releasing or dropping
    /// that one does nothing, the outer call releases.
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_runtime::Locker) -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// use lock_runtime::LockOptions;
    ///
    /// let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(5));
    /// let lease = locker.acquire("invoice:42", &opts).await?; // `Busy` after 5 s of waiting
    /// println!("holding {} under fence {}", lease.name(), lease.fence());
    /// lease.release().await?; // or drop it: released in the background
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease, LockError> {
        if let Some(here) = self.engine_here() {
            return Box::pin(here.acquire(name, opts)).await;
        }
        opts.validate_for(name)?;
        if opts.fail_open() {
            return Err(LockError::config(
                name,
                "fail_open is for locked calls (`Locker::run`, `#[distributed_lock]`), which can \
                 run their body without the lock; a lease taken by hand is the lock itself: drop \
                 fail_open here",
            ));
        }
        check_name(name, self.inner.format)?;
        let key = self.key_of(name);
        if let Some(found) = crate::api::reentrancy::find(self.id(), &key) {
            return self.nested(Arc::clone(found.lease()), opts).await;
        }
        self.inner
            .acquirer
            .acquire(key, name.to_owned(), opts)
            .await
    }

    /// Runs `body` under the lock `name`: acquire, renew, cancel the body at `max_exec` or when
    /// the lock is lost, and release on every path (panics are resumed after the release).
    ///
    /// Reentrant within a task: a nested `run` (or locked function) on a name the current task
    /// already holds through this locker runs under the held lease, bounded by its own
    /// `max_exec`, and leaves the release to the outer call. Nested sections that the body runs
    /// at once (`join!`, `select!`, a stream of futures) take turns, in the order they began; a
    /// section strictly inside another runs at once. Another task, even one spawned by the
    /// holder, is another holder and waits.
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_runtime::Locker) -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// use lock_runtime::LockOptions;
    /// let opts = LockOptions::new(Duration::from_secs(10));
    /// let fence = locker.run("nightly", &opts, async |lease| lease.fence()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<T, F>(&self, name: &str, opts: &LockOptions, body: F) -> Result<T, LockError>
    where
        F: AsyncFnOnce(&Lease) -> T,
    {
        self.run_owned_name(name.to_owned(), opts, body).await
    }

    /// Like [`run`](Self::run), for a body that returns `Result<T, E>` with `E: From<LockError>`:
    /// a lock failure comes back as `Err(E::from(..))`, so the result is the body's own type
    /// (the contract of `#[distributed_lock]`).
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_runtime::Locker) -> Result<(), std::io::Error> {
    /// use std::time::Duration;
    /// use lock_runtime::LockOptions;
    /// let opts = LockOptions::new(Duration::from_secs(10));
    /// let fence: u64 = locker
    ///     .try_run("nightly", &opts, async |lease| Ok::<_, std::io::Error>(lease.fence()))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_run<T, E, F>(&self, name: &str, opts: &LockOptions, body: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&Lease) -> Result<T, E>,
        E: From<LockError>,
    {
        match self.run(name, opts, body).await {
            Ok(out) => out,
            Err(e) => Err(E::from(e)),
        }
    }

    pub(crate) async fn run_owned_name<T, F>(
        &self,
        name: String,
        opts: &LockOptions,
        body: F,
    ) -> Result<T, LockError>
    where
        F: AsyncFnOnce(&Lease) -> T,
    {
        if let Some(here) = self.engine_here() {
            return Box::pin(here.run_owned_name(name, opts, body)).await;
        }
        opts.validate_for(&name)?;
        check_name(&name, self.inner.format)?;
        let key = self.key_of(&name);
        // One span per locked call; its fields are filled in as the call goes.
        let span = tracing::info_span!(
            target: "lock_runtime",
            "lock",
            name = %name,
            template = opts.template(),
            key = %key,
            fence = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        // The call's future goes straight into `instrument`: bound to a local first, it would be
        // kept twice in this future (once as the local, once inside the span's wrapper).
        let out = tracing::Instrument::instrument(
            async {
                // The wait is timed only for a span that records it.
                let begun = (!span.is_disabled()).then(tokio::time::Instant::now);
                if let Some(found) = crate::api::reentrancy::find(self.id(), &key) {
                    // After the sections nested beside this one that came first.
                    let _turn = found.turn().await;
                    let lease = self.nested(Arc::clone(found.lease()), opts).await?;
                    record_fence(&span, &lease);
                    if let Some(begun) = begun {
                        span.record("waited_ms", begun.elapsed().as_millis() as u64);
                    }
                    return found
                        .section(crate::api::run::run_body(lease, opts, body))
                        .await;
                }
                // Kept only for a call that may run without the lock.
                let unlocked = opts.fail_open().then(|| (name.clone(), key.clone()));
                let lease = match self.inner.acquirer.acquire(key, name, opts).await {
                    Ok(lease) => lease,
                    Err(e) => match unlocked.filter(|_| e.is_unreachable()) {
                        Some((name, key)) => {
                            let keys = Keys::new(key, self.inner.format);
                            let lease = Lease::unlocked(name, keys, opts);
                            telemetry::unlocked_run(lease.state.label(), &e);
                            return crate::api::run::run_body(lease, opts, body).await;
                        }
                        None => return Err(e),
                    },
                };
                record_fence(&span, &lease);
                if let Some(begun) = begun {
                    span.record("waited_ms", begun.elapsed().as_millis() as u64);
                }
                let state = Arc::clone(&lease.state);
                crate::api::reentrancy::holding(
                    self.id(),
                    state,
                    crate::api::run::run_body(lease, opts, body),
                )
                .await
            },
            span.clone(),
        )
        .await;
        span.record("outcome", outcome_of(&out));
        out
    }

    /// The lease this task already holds, seen again by a nested call; with its fence computed
    /// now if it was taken without one and this call can read it.
    async fn nested(
        &self,
        held: Arc<crate::state::lease_state::LeaseState>,
        opts: &LockOptions,
    ) -> Result<Lease, LockError> {
        if held.held.kind() == HoldKind::Shared && opts.kind() != HoldKind::Shared {
            return Err(LockError::config(
                &held.name,
                "an exclusive hold inside a shared hold of the same name, in the same task: a \
                 shared hold cannot become an exclusive one (the call would wait for itself); \
                 take the exclusive hold in the outer call",
            ));
        }
        let deployment = &self.inner.acquirer.deployment;
        if opts.fenced() {
            deployment.fence_for(&held).await?;
        }
        Ok(Lease::nested(held))
    }
}

/// The span's `fence` field, when the lease has one (see `LockOptions::without_fence`).
fn record_fence(span: &tracing::Span, lease: &Lease) {
    if lease.fence() != 0 {
        span.record("fence", lease.fence());
    }
}

/// The `outcome` field of a call's span.
fn outcome_of<T>(out: &Result<T, LockError>) -> &'static str {
    match out {
        Ok(_) => "ok",
        Err(LockError::Busy { .. }) => "busy",
        Err(LockError::Lost { .. }) => "lost",
        Err(LockError::MaxExecExceeded { .. }) => "max_exec",
        Err(LockError::Config { .. }) => "config_error",
        Err(_) => "redis_error",
    }
}
