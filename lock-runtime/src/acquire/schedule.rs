//! When a waiting caller tries again: the decisions of the wait loop, as pure functions of what
//! the last attempt said, so that they can be read and tested without a server.

use std::time::Duration;

use crate::LockError;

/// The first pause after a failed request, doubled after each failure up to [`ERROR_PAUSE_MAX`].
const ERROR_PAUSE_FIRST: Duration = Duration::from_millis(10);
const ERROR_PAUSE_MAX: Duration = Duration::from_millis(200);
/// The first pause on a held key without a ttl, doubled after each up to [`BUSY_PAUSE_MAX`].
const BUSY_PAUSE_FIRST: Duration = Duration::from_millis(20);
const BUSY_PAUSE_MAX: Duration = Duration::from_secs(1);

/// What to do after an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterError {
    /// The connection was gone before the request and is being made again: once more, at once.
    Reconnect,
    /// The deployment failed this time: try again after this pause (jitter to be added), if
    /// the wait lasts that long.
    Pause(Duration),
    /// This error is the answer.
    Fail,
}

/// The growing pauses of one wait.
#[derive(Debug)]
pub(crate) struct Backoff {
    error: Duration,
    busy: Duration,
    reconnected: bool,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Self {
            error: ERROR_PAUSE_FIRST,
            busy: BUSY_PAUSE_FIRST,
            reconnected: false,
        }
    }

    /// The next step after `err`, for a call that may wait (`wait > 0`) or not. A dropped
    /// connection is retried once at once, `wait = 0` included (the failed attempt undid what
    /// it did); a failure of the servers is retried within the wait after a growing pause; bad
    /// input, a lost or foreign key and anything else is never retried.
    pub(crate) fn after_error(&mut self, err: &LockError, may_wait: bool) -> AfterError {
        match err {
            LockError::Redis { error, .. }
                if error.is_connection_dropped() && !self.reconnected =>
            {
                self.reconnected = true;
                AfterError::Reconnect
            }
            LockError::QuorumUnavailable { .. }
            | LockError::NotReplicated { .. }
            | LockError::Redis { .. }
                if may_wait =>
            {
                let pause = self.error;
                self.error = (pause * 2).min(ERROR_PAUSE_MAX);
                AfterError::Pause(pause)
            }
            _ => AfterError::Fail,
        }
    }

    /// How long to sleep, before the caps of [`retry_delay`], after an attempt found the key
    /// held without a ttl (not set by this library): a growing pause. A key with a ttl is tried
    /// again when it expires; a release message wakes the waiter earlier either way.
    pub(crate) fn without_ttl(&mut self) -> Duration {
        let pause = self.busy;
        self.busy = (pause * 2).min(BUSY_PAUSE_MAX);
        pause
    }
}

/// The sleep before the next attempt: `after`, but no later than the `poll` period (a holder may
/// be a client that does not announce its release) nor, for a queued waiter (`grace`), than it
/// must come back to keep its place. Behind a key without an expiry, or in front of a free one,
/// others evict a head that stays away longer than its grace: a third of it. Behind a key that
/// expires (`behind_expiry`), nobody evicts anyone until the key is free, which a release
/// message or the expiry (`after`) tells first, and the queue's keys outlive two graces: the
/// whole grace.
pub(crate) fn retry_delay(
    after: Duration,
    grace: Option<Duration>,
    poll: Option<Duration>,
    behind_expiry: bool,
) -> Duration {
    let mut delay = after;
    if let Some(grace) = grace {
        delay = delay.min(if behind_expiry { grace } else { grace / 3 });
    }
    if let Some(poll) = poll {
        delay = delay.min(poll);
    }
    delay
}

/// The spread of the random delay added to a pause of `pause`: 5 ms and a twentieth of it, so
/// that waiters that saw the same ttl do not retry in lockstep.
pub(crate) fn jitter_spread(pause: Duration) -> Duration {
    Duration::from_millis(5) + pause / 20
}

/// A random delay for `pause` (see [`jitter_spread`]).
pub(crate) fn jitter(pause: Duration) -> Duration {
    let spread = jitter_spread(pause);
    Duration::from_micros(crate::model::random::up_to(spread.as_micros() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io_error(kind: std::io::ErrorKind) -> LockError {
        LockError::Redis {
            name: "job".into(),
            addr: "127.0.0.1:1".into(),
            error: redis::RedisError::from(std::io::Error::new(kind, "test")),
        }
    }

    fn dropped() -> LockError {
        io_error(std::io::ErrorKind::BrokenPipe)
    }

    fn timed_out() -> LockError {
        io_error(std::io::ErrorKind::TimedOut)
    }

    fn no_majority() -> LockError {
        LockError::QuorumUnavailable {
            name: "job".into(),
            got: 1,
            needed: 2,
            failures: Vec::new(),
        }
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn errors_are_retried_as_the_table_says() {
        let config = || LockError::config("job", "bad");
        // (errors in order, may wait, the steps expected)
        let table: Vec<(Vec<LockError>, bool, Vec<AfterError>)> = vec![
            (vec![dropped()], false, vec![AfterError::Reconnect]),
            (
                vec![dropped(), dropped()],
                false,
                vec![AfterError::Reconnect, AfterError::Fail],
            ),
            (
                vec![dropped(), dropped(), dropped()],
                true,
                vec![
                    AfterError::Reconnect,
                    AfterError::Pause(MS(10)),
                    AfterError::Pause(MS(20)),
                ],
            ),
            (vec![timed_out()], false, vec![AfterError::Fail]),
            (vec![no_majority()], false, vec![AfterError::Fail]),
            (
                vec![no_majority(), timed_out(), no_majority()],
                true,
                vec![
                    AfterError::Pause(MS(10)),
                    AfterError::Pause(MS(20)),
                    AfterError::Pause(MS(40)),
                ],
            ),
            (vec![config()], true, vec![AfterError::Fail]),
            (
                vec![LockError::NotALock {
                    name: "job".into(),
                    key: "lock:{job}".into(),
                    detail: "holds a list value, not a lock".into(),
                }],
                true,
                vec![AfterError::Fail],
            ),
            (
                vec![LockError::Busy {
                    name: "job".into(),
                    waited: MS(1),
                    wait: MS(0),
                }],
                true,
                vec![AfterError::Fail],
            ),
        ];
        for (errors, may_wait, expected) in table {
            let mut backoff = Backoff::new();
            let steps: Vec<AfterError> = errors
                .iter()
                .map(|e| backoff.after_error(e, may_wait))
                .collect();
            assert_eq!(steps, expected, "{errors:?} (may wait: {may_wait})");
        }
    }

    #[test]
    fn pauses_double_up_to_their_caps() {
        let mut backoff = Backoff::new();
        let errors: Vec<_> = (0..7)
            .map(|_| backoff.after_error(&no_majority(), true))
            .collect();
        let ms = [10, 20, 40, 80, 160, 200, 200];
        assert_eq!(
            errors,
            ms.map(|m| AfterError::Pause(MS(m))).to_vec(),
            "error pauses"
        );
        let busy: Vec<_> = (0..8).map(|_| backoff.without_ttl()).collect();
        let ms = [20, 40, 80, 160, 320, 640, 1000, 1000];
        assert_eq!(busy, ms.map(MS).to_vec(), "pauses on a key without a ttl");
    }

    #[test]
    fn the_retry_delay_is_the_earliest_reason_to_come_back() {
        // (after, grace, poll, behind a key that expires, expected)
        let table = [
            (MS(900), None, None, false, MS(900)),
            (MS(900), Some(MS(300)), None, false, MS(100)),
            (MS(900), Some(MS(300)), None, true, MS(300)),
            (MS(50), Some(MS(300)), None, false, MS(50)),
            (MS(50), Some(MS(300)), None, true, MS(50)),
            (MS(900), None, Some(MS(250)), true, MS(250)),
            (MS(900), Some(MS(600)), Some(MS(250)), false, MS(200)),
            (MS(900), Some(MS(600)), Some(MS(250)), true, MS(250)),
            (MS(0), Some(MS(600)), Some(MS(250)), false, MS(0)),
        ];
        for (after, grace, poll, behind_expiry, expected) in table {
            assert_eq!(
                retry_delay(after, grace, poll, behind_expiry),
                expected,
                "{after:?} {grace:?} {poll:?} {behind_expiry}"
            );
        }
    }

    #[test]
    fn jitter_stays_within_its_spread() {
        for (pause, spread) in [(MS(0), MS(5)), (MS(100), MS(10)), (MS(2000), MS(105))] {
            assert_eq!(jitter_spread(pause), spread);
            for _ in 0..100 {
                assert!(jitter(pause) <= spread);
            }
        }
    }
}
