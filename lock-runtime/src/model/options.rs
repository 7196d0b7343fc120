//! How one lock is held: lengths of the lease, the renewal period and the waits.

use std::time::Duration;

use super::hold::HoldKind;
use crate::LockError;

/// The options of one locked call. Const-constructible, so the attribute builds one at compile
/// time; options built by hand at run time are checked by [`LockOptions::validate`].
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockOptions;
///
/// const OPTS: LockOptions = LockOptions::new(Duration::from_secs(30))
///     .with_wait(Duration::from_secs(5));
/// assert!(OPTS.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    lease: Option<Duration>,
    permits: u32,
    shared: bool,
    fail_open: bool,
    max_exec: Option<Duration>,
    renew: Option<Duration>,
    wait: Duration,
    min_hold: Duration,
    template: Option<&'static str>,
    /// Whether the caller can read the lease's fence (see [`without_fence`](Self::without_fence)).
    fenced: bool,
}

/// The clock drift allowed for a lease of this `ttl`: `ttl/100 + 2ms` (the same as
/// [`LockOptions::drift`] of options with this ttl).
pub const fn drift_for(ttl: Duration) -> Duration {
    Duration::from_millis(lock_rules::drift_ms(whole_millis(ttl)))
}

/// `d` in milliseconds, rounded down (saturating: no lock lasts 584 million years).
const fn whole_millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    if ms > u64::MAX as u128 {
        u64::MAX
    } else {
        ms as u64
    }
}

/// `d` in milliseconds, rounded up. The rules compare whole milliseconds; rounding a sub-ms
/// `max_exec`, `renew` or `min_hold` up keeps their upper bounds exact (the bounds are whole) and
/// can only reject a `renew` within half a millisecond of an odd ttl's half.
fn millis_up(d: Duration) -> u64 {
    let ms = whole_millis(d);
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms.saturating_add(1)
    }
}

/// A `with_*` setter of [`LockOptions`]: a `const fn` that takes the options by value and
/// sets one field (`with_x(x: T) = <new value of the field x>`).
macro_rules! setter {
    ($(#[$doc:meta])* $name:ident($field:ident: $ty:ty) = $value:expr;) => {
        $(#[$doc])*
        #[must_use]
        pub const fn $name(mut self, $field: $ty) -> Self {
            self.$field = $value;
            self
        }
    };
}

impl LockOptions {
    /// Options with this `ttl` (the longest one hold may last, and the key's expiry unless
    /// [`with_lease`](Self::with_lease) sets a shorter one) and every other option at its
    /// default: `renew = ttl/3`, `max_exec = ttl - (ttl/100 + 2ms)`, `wait = 0` (try once),
    /// `min_hold = 0`.
    pub const fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            lease: None,
            permits: 1,
            shared: false,
            fail_open: false,
            max_exec: None,
            renew: None,
            wait: Duration::ZERO,
            min_hold: Duration::ZERO,
            template: None,
            fenced: true,
        }
    }

    setter! {
        /// The key's expiry, renewed every `renew` (default `lease/3`) while the body runs: a
        /// holder that dies frees the lock within `lease`, while a live one may run up to
        /// `max_exec` (bounded by `ttl`). A paused holder can rely on its lease for `lease - drift`
        /// after its last confirmed renewal. At least 3 ms, at most `ttl`; without it, the key
        /// expires after `ttl`.
        with_lease(lease: Duration) = Some(lease);
    }

    setter! {
        /// The body is cancelled when it has run this long.
        with_max_exec(max_exec: Duration) = Some(max_exec);
    }

    setter! {
        /// The watchdog re-sets the key's expiry this often; more often on a link whose round
        /// trip leaves less than two periods of the lease (see `docs/guarantees.md`).
        with_renew(renew: Duration) = Some(renew);
    }

    setter! {
        /// How long to wait for a busy lock; zero tries exactly once.
        with_wait(wait: Duration) = wait;
    }

    setter! {
        /// Keep the key at least this long after the start, even when the body ends earlier.
        with_min_hold(min_hold: Duration) = min_hold;
    }

    setter! {
        /// The name's template, such as `"report:{tenant}"`: the `lock` label of the metrics and
        /// the `template` field of the tracing span, where rendered names (one per tenant, per
        /// invoice..) would be too many distinct values. `#[distributed_lock]` sets it to its
        /// `name`; without it, the lock's name is the label.
        with_template(template: &'static str) = Some(template);
    }

    setter! {
        /// Up to `permits` holders at once (a semaphore; 1, the default, is a lock). Each holder
        /// has its own lease, renewal, fence and release, as a lock's holder has; fences grow
        /// across the holders of the name. Everyone using the name must use the same number:
        /// another one is a [`LockError::Config`] that names both. One logical server only (one
        /// server, Redis Cluster, Sentinel); on Redlock's independent servers a `Config` error.
        with_permits(permits: u32) = permits;
    }

    /// How many holders may hold the lock at once (1: a lock).
    pub const fn permits(&self) -> u32 {
        self.permits
    }

    setter! {
        /// A shared hold of a read-write lock (`true`), or an exclusive one (`false`, the
        /// default). Shared holds of one name run together; an exclusive hold runs alone; waiters
        /// are served in arrival order, so a waiting exclusive caller is not starved by shared
        /// ones that came after it. Each shared holder has its own lease, fence and release. Not
        /// with [`with_permits`](Self::with_permits); one logical server only (one server, Redis
        /// Cluster, Sentinel), on Redlock's independent servers a [`LockError::Config`].
        with_shared(shared: bool) = shared;
    }

    /// Whether the hold is shared (see [`with_shared`](Self::with_shared)).
    pub const fn shared(&self) -> bool {
        self.shared
    }

    setter! {
        /// Run the body even when Redis cannot be reached (`true`; `false`, the default, fails
        /// the call with the Redis error). When no server answers (connection refused, timeouts,
        /// no quorum of Redlock's servers), [`Locker::run`](crate::Locker::run) and the attribute
        /// run the body without a lock, with one WARN per call and the counter
        /// `lock_unlocked_runs_total`. A busy lock is never a reason: the call waits or fails as
        /// without it. Only for bodies that stay correct when two run at once (cache warm-ups,
        /// idempotent syncs): their lease holds nothing, its fence is 0, and
        /// [`Lease::is_held`](crate::Lease::is_held) says false. Not with permits; a lease
        /// taken by hand ([`Locker::acquire`](crate::Locker::acquire)) is refused with it.
        with_fail_open(fail_open: bool) = fail_open;
    }

    /// Whether the body runs without a lock while Redis is unreachable (see
    /// [`with_fail_open`](Self::with_fail_open)).
    pub const fn fail_open(&self) -> bool {
        self.fail_open
    }

    /// What one hold takes (see [`HoldKind`]).
    pub(crate) const fn kind(&self) -> HoldKind {
        if self.shared {
            HoldKind::Shared
        } else if self.permits > 1 {
            HoldKind::Permits(self.permits)
        } else {
            HoldKind::Exclusive
        }
    }

    /// The mode of the hold, as the metrics label it: `"exclusive"`, `"shared"` or `"permits"`.
    pub const fn mode(&self) -> &'static str {
        self.kind().label()
    }

    /// For `#[distributed_lock]` without `guard`, whose body cannot see its lease: an
    /// uncontended acquire on one server, and every attempt on Redlock, then skips the fence
    /// (the server's clock and the counter), which nobody could read. A nested call that can
    /// see the lease gets a fence computed then, while the key is still held (see
    /// `Locker::acquire`). Not for calls that hand out the lease; the expansion reaches it
    /// through `__private::without_fence`.
    #[must_use]
    pub(crate) const fn without_fence(mut self) -> Self {
        self.fenced = false;
        self
    }

    /// Whether this call's lease needs a fence (false only through `without_fence`).
    pub(crate) const fn fenced(&self) -> bool {
        self.fenced
    }

    /// The name's template, when one was given (see [`with_template`](Self::with_template)).
    pub const fn template(&self) -> Option<&'static str> {
        self.template
    }

    /// The longest one hold may last.
    pub const fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The key's expiry, renewed while the body runs (default: `ttl`).
    pub const fn lease(&self) -> Duration {
        match self.lease {
            Some(lease) => lease,
            None => self.ttl,
        }
    }

    /// The body's time limit (default: `ttl - drift`).
    pub const fn max_exec(&self) -> Duration {
        match self.max_exec {
            Some(d) => d,
            None => Duration::from_millis(lock_rules::default_max_exec_ms(whole_millis(self.ttl))),
        }
    }

    /// The renewal period (default: `lease / 3`).
    pub const fn renew(&self) -> Duration {
        match self.renew {
            Some(d) => d,
            None => Duration::from_millis(lock_rules::default_renew_ms(whole_millis(self.lease()))),
        }
    }

    /// How long to wait for a busy lock (zero: try once).
    pub const fn wait(&self) -> Duration {
        self.wait
    }

    /// The minimum time the key is kept from the start.
    pub const fn min_hold(&self) -> Duration {
        self.min_hold
    }

    /// The clock drift allowed for this lease: `lease/100 + 2ms`. A lease is valid until
    /// `lease - drift` after its last confirmed renewal was sent.
    pub const fn drift(&self) -> Duration {
        drift_for(self.lease())
    }

    /// How long a lease is known valid after its acquire was sent: `lease - drift`.
    pub(crate) const fn validity(&self) -> Duration {
        self.lease().saturating_sub(self.drift())
    }

    /// Checks the rules of the attribute's table (the same code checks the attribute when it
    /// compiles); the error names every rule that failed and what to do.
    pub fn validate(&self) -> Result<(), LockError> {
        self.validate_for("")
    }

    pub(crate) fn validate_for(&self, name: &str) -> Result<(), LockError> {
        if let Some(message) = lock_rules::check_permits(u64::from(self.permits)) {
            return Err(LockError::config(name, message));
        }
        if let Some(message) = lock_rules::check_shared(self.shared, u64::from(self.permits)) {
            return Err(LockError::config(name, message));
        }
        // A body run by hand always sees its lease; `guard` is the attribute's own rule.
        let permits = u64::from(self.permits);
        if let Some(message) = lock_rules::check_fail_open(self.fail_open, permits, false) {
            return Err(LockError::config(name, message));
        }
        let broken = self
            .broken_rules()
            .map_err(|message| LockError::config(name, message))?;
        if broken.is_empty() {
            return Ok(());
        }
        let messages: Vec<String> = broken.into_iter().map(|b| b.message).collect();
        Err(LockError::config(name, messages.join("; ")))
    }

    /// The rules these options break; `Err` for a ttl or lease that is not whole milliseconds
    /// (Redis keeps expiries in milliseconds, so the key would not live as long as asked).
    fn broken_rules(&self) -> Result<Vec<lock_rules::Broken>, String> {
        for (option, value) in [("ttl", Some(self.ttl)), ("lease", self.lease)] {
            if let Some(value) = value
                && !value.subsec_nanos().is_multiple_of(1_000_000)
            {
                return Err(format!(
                    "{option} = {value:?} must be a whole number of milliseconds, at least {}ms; \
                     round it",
                    lock_rules::MIN_TTL_MS
                ));
            }
        }
        Ok(lock_rules::check(lock_rules::Durations {
            ttl: whole_millis(self.ttl),
            lease: self.lease.map(whole_millis),
            max_exec: self.max_exec.map(millis_up),
            renew: self.renew.map(millis_up),
            min_hold: Some(millis_up(self.min_hold)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(durations: lock_rules::Durations) -> LockOptions {
        let ms = Duration::from_millis;
        let mut opts = LockOptions::new(ms(durations.ttl));
        if let Some(lease) = durations.lease {
            opts = opts.with_lease(ms(lease));
        }
        if let Some(max_exec) = durations.max_exec {
            opts = opts.with_max_exec(ms(max_exec));
        }
        if let Some(renew) = durations.renew {
            opts = opts.with_renew(ms(renew));
        }
        if let Some(min_hold) = durations.min_hold {
            opts = opts.with_min_hold(ms(min_hold));
        }
        opts
    }

    /// The same table as the attribute's test in lock-macros: both accept and reject alike.
    #[test]
    fn validate_follows_the_shared_rules_table() {
        for case in lock_rules::CASES {
            let opts = options(case.durations);
            let broken = opts.broken_rules().unwrap();
            let blamed: Vec<_> = broken.iter().map(|b| b.key).collect();
            assert_eq!(blamed, case.blamed, "{case:?}");
            match opts.validate_for("job") {
                Ok(()) => assert!(case.blamed.is_empty(), "{case:?}"),
                Err(LockError::Config { name, message }) => {
                    assert_eq!(name, "job");
                    let expected: Vec<String> = broken.into_iter().map(|b| b.message).collect();
                    assert_eq!(message, expected.join("; "));
                }
                Err(other) => panic!("{other}"),
            }
        }
    }

    #[test]
    fn sub_millisecond_values() {
        let us = Duration::from_micros;
        let err = LockOptions::new(us(1_500))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("whole number of milliseconds, at least 3ms"),
            "{err}"
        );
        // Other options may have sub-ms parts; their upper bounds stay exact.
        let ttl = LockOptions::new(Duration::from_secs(30));
        assert!(ttl.with_max_exec(us(29_698_000)).validate().is_ok());
        assert!(ttl.with_max_exec(us(29_698_001)).validate().is_err());
        assert!(ttl.with_max_exec(us(1)).validate().is_ok());
        assert!(ttl.with_renew(us(14_999_999)).validate().is_ok());
        assert!(ttl.with_renew(us(15_000_001)).validate().is_err());
        assert!(ttl.with_min_hold(us(30_000_001)).validate().is_err());
    }

    #[test]
    fn getters_give_the_effective_values() {
        let ms = Duration::from_millis;
        let opts = LockOptions::new(ms(30_000));
        assert_eq!(opts.max_exec(), ms(29_698));
        assert_eq!(opts.renew(), ms(10_000));
        assert_eq!(opts.drift(), ms(302));
        assert_eq!(drift_for(ms(150)), ms(3));
        assert_eq!(opts.wait(), Duration::ZERO);
        assert_eq!(opts.min_hold(), Duration::ZERO);
    }
}
