//! The Redis names of one lock, and which lock names are allowed.

use crate::LockError;

/// The Redis names of one lock: its key, and the names derived from it (fence counter, release
/// channel, waiter queue). The derived names are written straight into commands (no string per
/// name).
///
/// With hash-tagged keys (`<prefix>{<name>}`) a derived name is the key and a suffix: every name
/// shares the key's `{hash tag}`, so one script can touch them all on Redis Cluster, and no lock
/// name (which cannot contain a brace) can reach them. A plain key (`<prefix><name>`) can be any
/// string under the prefix, so its derived names are `{<key>}` and a suffix: outside the prefix,
/// where no plain lock key (of this library or of another client) can reach them.
/// `K` is `String`, or `&str` for names borrowed from a lease (its release allocates nothing).
#[derive(Debug, Clone)]
pub(crate) struct Keys<K = String> {
    pub(crate) key: K,
    /// The derived names are `{<base>}<suffix>` (plain keys) rather than `<base><suffix>`.
    braced: bool,
    /// Where the lock's own key lies in `key`, which the names derive from: all of it for a
    /// lock; for one permit of a lock with `permits = N`, whose key is derived itself (see
    /// [`Keys::permit`]), the lock's key inside it.
    base: (usize, usize),
    /// N, for one permit of a lock with `permits = N`; 0 for a lock's key.
    permits: u32,
}

/// What a lock's key holds while permits hold the name, before N (see [`Keys::permit`]): the
/// mode of its holders, which callers of another mode or another N are refused by.
pub(crate) const PERMITS_MARK: &str = "permits:";

/// N, when a lock's key holds the mark of permits (`permits:<N>`, see [`Keys::permit`]): a
/// number from 1 to the most allowed.
pub(crate) fn permits_of(value: &str) -> Option<u32> {
    let n: u32 = value.strip_prefix(PERMITS_MARK)?.parse().ok()?;
    (1..=lock_rules::MAX_PERMITS)
        .contains(&u64::from(n))
        .then_some(n)
}

/// What a lock's key holds while shared holders hold it, before its first holder's value.
pub(crate) const SHARED_MARK: &str = "shared:";

/// What a permit's key adds to its lock's derived names, before the permit's number.
const PERMIT: &str = ":permit:";

/// What a lock's key holds while it is handed to a waiter by id, before the waiter's id (see
/// `scripts::RELEASE`); also the start of a grant message.
pub(crate) const HANDED_MARK: &str = "~";

/// What a key kept for `min_hold` holds after its released holder's value: no lease's token, so
/// that a late renewal cannot stretch it.
pub(crate) const KEPT_MARK: &str = ":released";

/// What a waiter id has before its locker's grant channel id (see [`Keys::grant_channels`]).
pub(crate) const GRANTS_MARK: &str = ";grants=";

/// The last field of a value that no waiter queues behind (see `holder.rs`).
pub(crate) use crate::model::holder::UNMARKED;

/// [`UNMARKED`] once a waiter queues behind the value's holder (written in place, as long).
pub(crate) const MARKED: &str = ";w=1";

/// What a lock's key holds while permits of `permits = n` hold it.
pub(crate) fn permits_mark(n: u32) -> String {
    format!("{PERMITS_MARK}{n}")
}

/// A name derived from a lock key: the key (braced for a plain key) and a suffix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Derived<'a> {
    key: &'a str,
    braced: bool,
    suffix: &'static str,
}

impl std::fmt::Display for Derived<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.braced {
            f.write_str("{")?;
            f.write_str(self.key)?;
            f.write_str("}")?;
        } else {
            f.write_str(self.key)?;
        }
        f.write_str(self.suffix)
    }
}

impl redis::ToRedisArgs for Derived<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write;
        // Plain copies into the command's buffer: no formatting machinery, no string.
        let mut arg = out.writer_for_next_arg();
        if self.braced {
            let _ = arg.write_all(b"{");
            let _ = arg.write_all(self.key.as_bytes());
            let _ = arg.write_all(b"}");
        } else {
            let _ = arg.write_all(self.key.as_bytes());
        }
        let _ = arg.write_all(self.suffix.as_bytes());
    }
}

impl<K: AsRef<str>> Keys<K> {
    pub(crate) fn new(key: K, format: KeyFormat) -> Self {
        let base = (0, key.as_ref().len());
        Self {
            key,
            braced: format == KeyFormat::Plain,
            base,
            permits: 0,
        }
    }

    /// N, for the key of one permit of a lock with `permits = N`; 0 for a lock's key.
    pub(crate) fn permits(&self) -> u32 {
        self.permits
    }

    /// The lock's own key: [`key`](Self::key), or, for a permit, the key of the lock it is a
    /// permit of (which holds [`PERMITS_MARK`] while permits are held).
    pub(crate) fn lock_key(&self) -> &str {
        &self.key.as_ref()[self.base.0..self.base.1]
    }

    /// The keys of every permit of the lock a permit's key belongs to (empty for a lock's key).
    pub(crate) fn sibling_permits(&self) -> Vec<Keys> {
        let lock = Keys {
            key: self.lock_key(),
            braced: self.braced,
            base: (0, self.lock_key().len()),
            permits: 0,
        };
        (0..self.permits)
            .map(|i| lock.permit(i, self.permits))
            .collect()
    }

    fn derived(&self, suffix: &'static str) -> Derived<'_> {
        Derived {
            key: &self.key.as_ref()[self.base.0..self.base.1],
            braced: self.braced,
            suffix,
        }
    }

    /// The key of permit `index` of a lock with `permits = N`: a lock key of its own (held,
    /// renewed and released as a lock's key is), whose derived names are the lock's.
    pub(crate) fn permit(&self, index: u32, permits: u32) -> Keys<String> {
        let named = self.derived(PERMIT);
        let key = format!("{named}{index}");
        // The lock's key inside the permit's: after the brace of a plain key's derived name.
        let start = usize::from(self.braced);
        let base = (start, start + (self.base.1 - self.base.0));
        Keys {
            key,
            braced: self.braced,
            base,
            permits,
        }
    }

    /// The holders of a shared hold (a sorted set: each shared holder's `<token> <fence>`,
    /// scored by its own expiry), while the lock's key holds `shared:<token of the first>`.
    pub(crate) fn readers(&self) -> Derived<'_> {
        self.derived(":readers")
    }

    /// The fence counter.
    pub(crate) fn fence(&self) -> Derived<'_> {
        self.derived(":fence")
    }

    /// The channel a release is published on.
    pub(crate) fn channel(&self) -> Derived<'_> {
        self.derived(":released")
    }

    /// The start of the grant channels, before a locker's grant channel id: a release that
    /// grants the lock to a waiter of that locker publishes there (see [`GRANTS_MARK`]).
    pub(crate) fn grant_channels(&self) -> Derived<'_> {
        self.derived(":released:")
    }

    /// The index of a permit's key, as its key spells it (see [`Keys::permit`]); empty for a
    /// lock's key.
    pub(crate) fn permit_index(&self) -> &str {
        match self.permits {
            0 => "",
            _ => self.key.as_ref().rsplit_once(PERMIT).map_or("", |(_, i)| i),
        }
    }

    /// Waiters in arrival order (a sorted set scored by arrival number).
    pub(crate) fn queue(&self) -> Derived<'_> {
        self.derived(":waiters")
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
            // Every key under the prefix is a lock key: the derived keys are outside it.
            Self::Plain => Some(rest.to_owned()),
        }
    }

    /// The glob that matches the keys of the names that match `pattern`.
    pub(crate) fn glob(self, prefix: &str, pattern: &str) -> String {
        self.key(prefix, pattern)
    }

    /// The glob that matches the permit keys (see [`Keys::permit`]) of the names that match
    /// `pattern`: a lock with permits has no key of its own while held.
    pub(crate) fn permit_glob(self, prefix: &str, pattern: &str) -> String {
        let key = self.key(prefix, pattern);
        match self {
            Self::HashTagged => format!("{key}{PERMIT}*"),
            Self::Plain => format!("{{{key}}}{PERMIT}*"),
        }
    }

    /// The lock name of `key` when it is the key of one of its permits (see [`Keys::permit`]).
    pub(crate) fn name_of_permit(self, prefix: &str, key: &str) -> Option<String> {
        let (lock, index) = key.rsplit_once(PERMIT)?;
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let lock = match self {
            Self::HashTagged => lock,
            Self::Plain => lock.strip_prefix('{')?.strip_suffix('}')?,
        };
        self.name_of(prefix, lock)
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
            let keys = Keys::new(key.to_owned(), format);
            for derived in [keys.fence(), keys.queue(), keys.queue_states()] {
                assert_eq!(format.name_of("lock:", &derived.to_string()), None);
            }
            assert_eq!(format.name_of("other:", key), None);
        }
    }

    /// The names of one lock: its key and every derived key.
    fn key_set(format: KeyFormat, prefix: &str, name: &str) -> Vec<String> {
        let keys = Keys::new(format.key(prefix, name), format);
        let mut out = vec![keys.key.clone()];
        out.extend([keys.fence(), keys.queue(), keys.queue_states()].map(|d| d.to_string()));
        out
    }

    #[test]
    fn no_lock_name_reaches_another_locks_keys() {
        // Names built from the pieces that could collide: suffixes the engine uses, braces,
        // separators, and other names' keys.
        let pieces = [
            "",
            "job",
            ":fence",
            ":waiters",
            ":waiters:state",
            ":released",
            "{",
            "}",
            "{job}",
            "lock:",
            ":",
            "a",
        ];
        let mut names: Vec<String> = Vec::new();
        for a in pieces {
            for b in pieces {
                for c in ["", ":fence", "}:fence", "job"] {
                    names.push(format!("{a}{b}{c}"));
                }
            }
        }
        names.sort();
        names.dedup();
        for format in [KeyFormat::HashTagged, KeyFormat::Plain] {
            let mut owner: std::collections::HashMap<String, &str> = Default::default();
            let mut checked = 0;
            for name in names.iter().filter(|n| check_name(n, format).is_ok()) {
                for key in key_set(format, "lock:", name) {
                    if let Some(other) = owner.insert(key.clone(), name) {
                        panic!("{format:?}: `{name}` and `{other}` both use key `{key}`");
                    }
                }
                // A client that writes plain keys under the prefix (the article's Python
                // code, redis-py's `Lock`) never writes a derived key.
                for derived in &key_set(format, "lock:", name)[1..] {
                    assert!(!derived.starts_with("lock:") || format == KeyFormat::HashTagged);
                }
                checked += 1;
            }
            assert!(checked >= 200, "{format:?}: {checked} names");
        }
    }

    #[test]
    fn every_key_shares_the_hash_tag() {
        let keys = Keys::new("lock:{job}".to_owned(), KeyFormat::HashTagged);
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

    #[test]
    fn a_permits_names_are_its_locks() {
        for (format, key, permit) in [
            (KeyFormat::HashTagged, "lock:{job}", "lock:{job}:permit:2"),
            (KeyFormat::Plain, "lock:job", "{lock:job}:permit:2"),
        ] {
            let lock = Keys::new(key.to_owned(), format);
            let one = lock.permit(2, 3);
            assert_eq!(one.key, permit);
            assert_eq!(one.fence().to_string(), lock.fence().to_string());
            assert_eq!(one.channel().to_string(), lock.channel().to_string());
            assert_eq!(one.queue().to_string(), lock.queue().to_string());
            assert_eq!(one.permit_index(), "2");
            assert_eq!(lock.permit_index(), "");
            assert_eq!(
                one.grant_channels().to_string(),
                format!("{}:", lock.channel())
            );
            assert_ne!(lock.permit(1, 3).key, one.key);
            assert_eq!(one.lock_key(), key);
            let siblings: Vec<String> = one.sibling_permits().into_iter().map(|k| k.key).collect();
            assert_eq!(siblings.len(), 3);
            assert_eq!(siblings[2], one.key);
            // `list` finds a lock with permits by its permits' keys, under the lock's name.
            assert_eq!(
                format.name_of_permit("lock:", &one.key).as_deref(),
                Some("job")
            );
            assert_eq!(format.name_of("lock:", &one.key), None);
            assert_eq!(format.name_of_permit("lock:", key), None);
            assert_eq!(
                format.permit_glob("lock:", "j*"),
                permit.replace("job", "j*").replace('2', "*")
            );
            for derived in [lock.readers(), lock.fence()] {
                let derived = derived.to_string();
                assert_eq!(format.name_of_permit("lock:", &derived), None, "{derived}");
                if format == KeyFormat::HashTagged {
                    assert_eq!(format.name_of("lock:", &derived), None, "{derived}");
                } else {
                    assert!(!derived.starts_with("lock:"), "{derived}");
                }
            }
            // One hash tag, so one Redis Cluster slot (a plain key's names share `{<key>}`).
            let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
            assert_eq!(tag(&one.key), tag(&lock.fence().to_string()), "{format:?}");
        }
    }
}
