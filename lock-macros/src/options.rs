//! The attribute's options as a type. Every stage names an option through [`OptionKey`], so a
//! new option is one variant that the compiler then asks every `match` to handle.

use lock_rules::DurationKey;

use crate::suggest;

/// One option of `#[distributed_lock(...)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OptionKey {
    Name,
    Ttl,
    Lease,
    MaxExec,
    Renew,
    Wait,
    MinHold,
    Permits,
    Shared,
    FailOpen,
    Locker,
    Guard,
    Crate,
}

impl OptionKey {
    /// Every option, in the order the docs list them.
    pub(crate) const ALL: [Self; 13] = [
        Self::Name,
        Self::Ttl,
        Self::Lease,
        Self::MaxExec,
        Self::Renew,
        Self::Wait,
        Self::MinHold,
        Self::Permits,
        Self::Shared,
        Self::FailOpen,
        Self::Locker,
        Self::Guard,
        Self::Crate,
    ];

    /// The option as written in the attribute.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Name => "name",
            Self::Ttl => "ttl",
            Self::Lease => "lease",
            Self::MaxExec => "max_exec",
            Self::Renew => "renew",
            Self::Wait => "wait",
            Self::MinHold => "min_hold",
            Self::Permits => "permits",
            Self::Shared => "shared",
            Self::FailOpen => "fail_open",
            Self::Locker => "locker",
            Self::Guard => "guard",
            Self::Crate => "crate",
        }
    }

    /// What the option is, in a few words, for hints.
    const fn meaning(self) -> &'static str {
        match self {
            Self::Name => "the lock's key",
            Self::Ttl => "how long one hold may last",
            Self::Lease => "the key's expiry, renewed while the body runs",
            Self::MaxExec => "how long the body may run",
            Self::Renew => "how often the lease is renewed",
            Self::Wait => "how long to wait for a busy lock",
            Self::MinHold => "how long the key is kept at least",
            Self::Permits => "how many may hold it at once",
            Self::Shared => "a shared hold of a read-write lock",
            Self::FailOpen => "run the body without the lock while Redis is unreachable",
            Self::Locker => "the `Locker` to use",
            Self::Guard => "a name for the `&Lease` in the body",
            Self::Crate => "the path to lock_runtime",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|key| key.name() == name)
    }

    /// The options a word from other lock libraries most likely means (ShedLock's
    /// `lockAtMostFor`, Redisson's `leaseTime`, a generic `timeout`...).
    fn meant_by(word: &str) -> &'static [Self] {
        let word: String = word
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect();
        match word.as_str() {
            "timeout" | "timeoutms" => &[Self::MaxExec, Self::Wait],
            "key" | "keyname" | "lockname" | "resource" => &[Self::Name],
            "lockatmostfor" | "maxhold" => &[Self::Ttl],
            "leasetime" | "expiry" | "expire" | "expires" | "expiration" | "keepalive" => {
                &[Self::Lease, Self::Ttl]
            }
            "retry" | "retries" | "waittime" | "waitfor" | "acquiretimeout" | "block"
            | "blocking" => &[Self::Wait],
            "deadline" | "maxexecution" | "maxduration" | "executiontimeout" => &[Self::MaxExec],
            "renewal" | "refresh" | "extend" | "heartbeat" | "watchdog" => &[Self::Renew],
            "lockatleastfor" | "hold" | "minhold" => &[Self::MinHold],
            "client" | "connection" | "redis" => &[Self::Locker],
            "semaphore" | "maxconcurrent" | "concurrency" | "limit" | "slots" => &[Self::Permits],
            "read" | "reader" | "readlock" | "readonly" | "readwrite" | "rwlock" => &[Self::Shared],
            _ => &[],
        }
    }

    /// The options an unknown word probably stands for: what it means in other lock
    /// libraries, else the option it is a typo of (within two edits).
    pub(crate) fn meant_for(word: &str) -> Vec<Self> {
        let meant = Self::meant_by(word);
        if !meant.is_empty() {
            return meant.to_vec();
        }
        let typo = suggest::closest(&word.to_lowercase(), Self::ALL.map(Self::name));
        typo.and_then(Self::from_name).into_iter().collect()
    }

    /// The message for an option that does not exist, given [`meant_for`](Self::meant_for).
    pub(crate) fn unknown(word: &str, meant: &[Self]) -> String {
        match meant {
            [] => {
                let all: Vec<&str> = Self::ALL.map(Self::name).to_vec();
                format!(
                    "unknown option `{word}`; the options are {}",
                    all.join(", ")
                )
            }
            [typo] if Self::meant_by(word).is_empty() => {
                format!("unknown option `{word}`; did you mean `{}`?", typo.name())
            }
            meant => {
                let hints: Vec<String> = meant
                    .iter()
                    .map(|key| format!("`{}` ({})", key.name(), key.meaning()))
                    .collect();
                format!(
                    "unknown option `{word}`; did you mean {}?",
                    hints.join(" or ")
                )
            }
        }
    }
}

impl From<DurationKey> for OptionKey {
    fn from(key: DurationKey) -> Self {
        match key {
            DurationKey::Ttl => Self::Ttl,
            DurationKey::Lease => Self::Lease,
            DurationKey::MaxExec => Self::MaxExec,
            DurationKey::Renew => Self::Renew,
            DurationKey::MinHold => Self::MinHold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_the_rules_crate() {
        for key in OptionKey::ALL {
            assert_eq!(OptionKey::from_name(key.name()), Some(key));
        }
        assert_eq!(OptionKey::from_name("r#crate"), None);
        for key in [
            DurationKey::Ttl,
            DurationKey::Lease,
            DurationKey::MaxExec,
            DurationKey::Renew,
            DurationKey::MinHold,
        ] {
            assert_eq!(OptionKey::from(key).name(), key.name());
        }
    }

    #[test]
    fn unknown_options_suggest_what_they_mean() {
        let unknown = |word: &str| OptionKey::unknown(word, &OptionKey::meant_for(word));
        assert_eq!(
            unknown("timeout"),
            "unknown option `timeout`; did you mean `max_exec` (how long the body may run) or \
             `wait` (how long to wait for a busy lock)?"
        );
        assert!(unknown("key").contains("did you mean `name`"));
        assert!(unknown("leaseTime").contains("did you mean `lease`"));
        assert!(unknown("expiry").contains("did you mean `lease`"));
        assert!(unknown("expiry").contains("or `ttl`"));
        assert!(unknown("lockAtMostFor").contains("did you mean `ttl`"));
        assert!(unknown("lock_at_least_for").contains("did you mean `min_hold`"));
        assert!(unknown("retry").contains("did you mean `wait`"));
        // Typos: within two edits.
        assert_eq!(unknown("tll"), "unknown option `tll`; did you mean `ttl`?");
        assert!(unknown("max_exe").ends_with("did you mean `max_exec`?"));
        assert!(unknown("maxexec").ends_with("did you mean `max_exec`?"));
        assert!(unknown("lock").ends_with("did you mean `locker`?"));
        assert!(unknown("TTL").ends_with("did you mean `ttl`?"));
        assert_eq!(
            OptionKey::meant_for("timeout"),
            [OptionKey::MaxExec, OptionKey::Wait]
        );
        assert_eq!(OptionKey::meant_for("nmae"), [OptionKey::Name]);
        assert_eq!(
            unknown("color"),
            "unknown option `color`; the options are name, ttl, lease, max_exec, renew, wait, \
             min_hold, permits, shared, fail_open, locker, guard, crate"
        );
    }
}
