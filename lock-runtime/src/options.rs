//! How one lock is held: lengths of the lease, the renewal period and the waits.

use std::time::Duration;

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
    max_exec: Option<Duration>,
    renew: Option<Duration>,
    wait: Duration,
    min_hold: Duration,
}

/// The clock drift allowed for a lease of this `ttl`: `ttl/100 + 2ms`.
pub const fn drift(ttl: Duration) -> Duration {
    let ms = ttl.as_millis() as u64;
    Duration::from_millis(ms / 100 + 2)
}

impl LockOptions {
    /// Options with this lease length and every other option at its default:
    /// `renew = ttl/3`, `max_exec = ttl - (ttl/100 + 2ms)`, `wait = 0` (try once), `min_hold = 0`.
    pub const fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            max_exec: None,
            renew: None,
            wait: Duration::ZERO,
            min_hold: Duration::ZERO,
        }
    }

    /// The body is cancelled when it has run this long.
    #[must_use]
    pub const fn with_max_exec(mut self, max_exec: Duration) -> Self {
        self.max_exec = Some(max_exec);
        self
    }

    /// The watchdog re-sets the key's expiry this often.
    #[must_use]
    pub const fn with_renew(mut self, renew: Duration) -> Self {
        self.renew = Some(renew);
        self
    }

    /// How long to wait for a busy lock; zero tries exactly once.
    #[must_use]
    pub const fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Keep the key at least this long after the start, even when the body ends earlier.
    #[must_use]
    pub const fn with_min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = min_hold;
        self
    }

    /// The lease length.
    pub const fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The body's time limit (default: `ttl - drift`).
    pub const fn max_exec(&self) -> Duration {
        match self.max_exec {
            Some(d) => d,
            None => self.ttl.saturating_sub(drift(self.ttl)),
        }
    }

    /// The renewal period (default: `ttl / 3`).
    pub const fn renew(&self) -> Duration {
        match self.renew {
            Some(d) => d,
            None => Duration::from_millis(self.ttl.as_millis() as u64 / 3),
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

    /// The clock drift allowed for this lease: `ttl/100 + 2ms`. A lease is valid until
    /// `ttl - drift` after its last confirmed renewal was sent.
    pub const fn drift(&self) -> Duration {
        drift(self.ttl)
    }

    /// Checks the rules of the attribute's table; the error says which rule failed.
    pub fn validate(&self) -> Result<(), LockError> {
        self.validate_for("")
    }

    pub(crate) fn validate_for(&self, name: &str) -> Result<(), LockError> {
        let ttl = self.ttl;
        if ttl < Duration::from_millis(1) || !ttl.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(LockError::config(
                name,
                format!("ttl = {ttl:?} must be a whole number of milliseconds, at least 1ms"),
            ));
        }
        let limit = ttl.saturating_sub(drift(ttl));
        let max_exec = self.max_exec();
        if max_exec.is_zero() || max_exec > limit {
            return Err(LockError::config(
                name,
                format!(
                    "max_exec = {max_exec:?} must be above zero and at most ttl - (ttl/100 + 2ms) = {limit:?}, \
                     so the body is stopped before the key can expire; raise ttl or lower max_exec"
                ),
            ));
        }
        let renew = self.renew();
        if renew.is_zero() || renew > ttl / 2 {
            return Err(LockError::config(
                name,
                format!(
                    "renew = {renew:?} must be above zero and at most ttl/2 = {:?}",
                    ttl / 2
                ),
            ));
        }
        if self.min_hold > ttl {
            return Err(LockError::config(
                name,
                format!(
                    "min_hold = {:?} must be at most ttl = {ttl:?}",
                    self.min_hold
                ),
            ));
        }
        Ok(())
    }
}
