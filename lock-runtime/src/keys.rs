//! The Redis names of one lock, and which lock names are allowed.

use crate::LockError;

/// The Redis names of one lock: its key, and the names derived from it (fence counter, release
/// channel, waiter queue). All share the key's `{hash tag}`, so one script can touch them all on
/// Redis Cluster. The derived names are written straight into commands (no string per name).
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) key: String,
}

/// A name derived from a lock key: the key and a suffix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Derived<'a> {
    key: &'a str,
    suffix: &'static str,
}

impl std::fmt::Display for Derived<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key)?;
        f.write_str(self.suffix)
    }
}

impl redis::ToRedisArgs for Derived<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write;
        // Two plain copies into the command's buffer: no formatting machinery, no string.
        let mut arg = out.writer_for_next_arg();
        let _ = arg.write_all(self.key.as_bytes());
        let _ = arg.write_all(self.suffix.as_bytes());
    }
}

fn derived<'a>(key: &'a str, suffix: &'static str) -> Derived<'a> {
    Derived { key, suffix }
}

/// The release channel of the lock with key `key`.
pub(crate) fn channel_of(key: &str) -> Derived<'_> {
    derived(key, ":released")
}

/// The fence counter of the lock with key `key`.
pub(crate) fn fence_of(key: &str) -> Derived<'_> {
    derived(key, ":fence")
}

/// The waiter queue of the lock with key `key`.
pub(crate) fn queue_of(key: &str) -> Derived<'_> {
    derived(key, ":waiters")
}

impl Keys {
    pub(crate) fn new(key: String) -> Self {
        Self { key }
    }

    fn derived(&self, suffix: &'static str) -> Derived<'_> {
        derived(&self.key, suffix)
    }

    /// The fence counter.
    pub(crate) fn fence(&self) -> Derived<'_> {
        fence_of(&self.key)
    }

    /// The channel a release is published on.
    pub(crate) fn channel(&self) -> Derived<'_> {
        channel_of(&self.key)
    }

    /// Waiters in arrival order (a sorted set scored by arrival number).
    pub(crate) fn queue(&self) -> Derived<'_> {
        queue_of(&self.key)
    }

    /// Each queued waiter's last attempt nonce and grace (a hash).
    pub(crate) fn queue_states(&self) -> Derived<'_> {
        self.derived(":waiters:state")
    }
}

/// Checks that `name` can be a lock name: not empty (a key of its own for nothing), and without
/// `{` or `}`, which would end the key's hash tag early so that the lock's keys no longer share
/// a Redis Cluster slot.
pub(crate) fn check_name(name: &str) -> Result<(), LockError> {
    let why = if name.is_empty() {
        "the lock name is empty; give it a name such as \"job\" or \"invoice:42\""
    } else if name.contains(['{', '}']) {
        "the lock name contains `{` or `}`, which would break the key's {hash tag} (the lock, \
         its fence counter and its queue must share one Redis Cluster slot); use another \
         character, such as `:` or `-`"
    } else {
        return Ok(());
    };
    Err(LockError::config(name, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_break_the_hash_tag_are_refused() {
        for good in ["job", "invoice:42", "a b", "ünï"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "{", "a{b", "a}b", "{a}"] {
            let err = check_name(bad).unwrap_err().to_string();
            assert!(err.contains("lock name"), "{bad}: {err}");
        }
    }

    #[test]
    fn every_key_shares_the_hash_tag() {
        let keys = Keys::new("lock:{job}".into());
        for k in [
            keys.fence(),
            keys.channel(),
            keys.queue(),
            keys.queue_states(),
        ] {
            assert!(k.to_string().starts_with("lock:{job}:"), "{k}");
        }
        // A derived name is one argument, written without a string of its own.
        let mut cmd = redis::cmd("GET");
        cmd.arg(keys.fence());
        assert_eq!(cmd.args_iter().count(), 2);
    }
}
