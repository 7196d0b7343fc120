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

/// How a lock's name becomes its Redis key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyFormat {
    /// `<prefix>{<name>}` (the default): the braces are a hash tag, so the lock, its fence
    /// counter and its queue share one Redis Cluster slot.
    #[default]
    HashTagged,
    /// Exactly `<prefix><name>`, as other clients write it (for example the Python
    /// `acquire_lock` of `SET lock:<name> <uuid> NX EX`), to share lock names with them. Not on
    /// a Redis Cluster (no hash tag keeps a lock's keys in one slot). Such clients do not
    /// publish their releases, so a waiter also retries every 20 ms while it waits.
    Plain,
}

impl KeyFormat {
    /// The key of lock `name` under `prefix`.
    pub(crate) fn key(self, prefix: &str, name: &str) -> String {
        let mut key = String::with_capacity(prefix.len() + name.len() + 2);
        key.push_str(prefix);
        match self {
            Self::HashTagged => {
                key.push('{');
                key.push_str(name);
                key.push('}');
            }
            Self::Plain => key.push_str(name),
        }
        key
    }

    /// The lock name of `key` (a key of this format under `prefix`), `None` for the lock's
    /// other keys (fence counter, queue).
    pub(crate) fn name_of(self, prefix: &str, key: &str) -> Option<String> {
        let rest = key.strip_prefix(prefix)?;
        match self {
            Self::HashTagged => {
                let inner = rest.strip_prefix('{')?.strip_suffix('}')?;
                (!inner.contains('}')).then(|| inner.to_owned())
            }
            Self::Plain => {
                let derived = [":fence", ":waiters", ":waiters:state"];
                (!derived.iter().any(|d| rest.ends_with(d))).then(|| rest.to_owned())
            }
        }
    }

    /// The glob that matches the keys of the names that match `pattern`.
    pub(crate) fn glob(self, prefix: &str, pattern: &str) -> String {
        self.key(prefix, pattern)
    }
}

/// Checks that `name` can be a lock name: not empty (a key of its own for nothing), and, with
/// hash-tagged keys, without `{` or `}`, which would end the key's hash tag early so that the
/// lock's keys no longer share a Redis Cluster slot.
pub(crate) fn check_name(name: &str, format: KeyFormat) -> Result<(), LockError> {
    let why = if name.is_empty() {
        "the lock name is empty; give it a name such as \"job\" or \"invoice:42\""
    } else if format == KeyFormat::HashTagged && name.contains(['{', '}']) {
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
            assert!(check_name(good, KeyFormat::HashTagged).is_ok(), "{good}");
        }
        for bad in ["", "{", "a{b", "a}b", "{a}"] {
            let err = check_name(bad, KeyFormat::HashTagged)
                .unwrap_err()
                .to_string();
            assert!(err.contains("lock name"), "{bad}: {err}");
        }
        // Plain keys have no hash tag to break; an empty name is still refused.
        assert!(check_name("{a}", KeyFormat::Plain).is_ok());
        assert!(check_name("", KeyFormat::Plain).is_err());
    }

    #[test]
    fn key_formats_round_trip_their_names() {
        for (format, key) in [
            (KeyFormat::HashTagged, "lock:{invoice:1}"),
            (KeyFormat::Plain, "lock:invoice:1"),
        ] {
            assert_eq!(format.key("lock:", "invoice:1"), key);
            assert_eq!(format.name_of("lock:", key).as_deref(), Some("invoice:1"));
            for derived in [":fence", ":waiters", ":waiters:state"] {
                assert_eq!(format.name_of("lock:", &format!("{key}{derived}")), None);
            }
            assert_eq!(format.name_of("other:", key), None);
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
