//! The Redis names of one lock, and which lock names are allowed.

use crate::LockError;

/// The Redis names of one lock: its key, fence counter, release channel and waiter queue. All
/// share the key's `{hash tag}`, so one script can touch them all on Redis Cluster.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) key: String,
    pub(crate) fence_key: String,
    pub(crate) channel: String,
    /// Waiters in arrival order (a sorted set scored by arrival number).
    pub(crate) queue: String,
    /// Each queued waiter's last attempt nonce and grace (a hash).
    pub(crate) queue_states: String,
}

impl Keys {
    pub(crate) fn new(key: String) -> Self {
        Self {
            fence_key: format!("{key}:fence"),
            channel: format!("{key}:released"),
            queue: format!("{key}:waiters"),
            queue_states: format!("{key}:waiters:state"),
            key,
        }
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
            &keys.fence_key,
            &keys.channel,
            &keys.queue,
            &keys.queue_states,
        ] {
            assert!(k.starts_with("lock:{job}:"), "{k}");
        }
    }
}
