//! Why a deployment could not serve a request, said as one error.

use std::time::Duration;

use super::Deployment;
use crate::LockError;
use crate::model::hold::HoldKind;
use crate::model::keys::{PERMITS_MARK, SHARED_MARK};

/// Why one server did not grant a lock.
pub(super) enum Failure {
    Redis(redis::RedisError),
    /// The key or its fence counter holds data that is not ours.
    Foreign {
        key: String,
        detail: String,
    },
    Other(String),
    /// Taken, but only `acked` of the `needed` replicas acknowledged it (the key was deleted).
    NotReplicated {
        acked: usize,
        needed: usize,
    },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redis(e) => write!(f, "{e}"),
            Self::Foreign { key, detail } => write!(f, "`{key}` {detail}"),
            Self::Other(detail) => f.write_str(detail),
            Self::NotReplicated { acked, needed } => write!(
                f,
                "taken, but only {acked} of the {needed} replica(s) asked for acknowledged it (deleted again)"
            ),
        }
    }
}

impl Deployment {
    /// A failure of the whole deployment: with one server, that server's own error; with
    /// several, which ones failed and why.
    pub(super) fn unavailable(
        &self,
        name: &str,
        got: usize,
        failures: Vec<(usize, Failure)>,
    ) -> LockError {
        if let [(i, failure)] = failures.as_slice()
            && self.alone().is_some()
        {
            return match failure {
                Failure::Redis(e) => self.nodes[*i].redis_error(name, e.clone()),
                Failure::Foreign { key, detail } => LockError::NotALock {
                    name: name.to_owned(),
                    key: key.clone(),
                    detail: detail.clone(),
                },
                Failure::Other(why) => LockError::config(name, why.clone()),
                Failure::NotReplicated { acked, needed } => LockError::NotReplicated {
                    name: name.to_owned(),
                    addr: self.nodes[*i].addr().to_owned(),
                    acked: *acked,
                    needed: *needed,
                },
            };
        }
        LockError::QuorumUnavailable {
            name: name.to_owned(),
            got,
            needed: self.majority.needed(),
            failures: failures
                .into_iter()
                .map(|(i, f)| (self.nodes[i].addr().to_owned(), f.to_string()))
                .collect(),
        }
    }
}

impl Deployment {
    /// The error of an attempt that got no answer within `bound` from any server.
    pub(crate) fn no_reply(&self, name: &str, bound: Duration) -> LockError {
        let why = format!("the server accepted the connection but did not answer within {bound:?}");
        let failures = (0..self.nodes.len())
            .map(|i| {
                let timeout = std::io::Error::new(std::io::ErrorKind::TimedOut, why.clone());
                (i, Failure::Redis(redis::RedisError::from(timeout)))
            })
            .collect();
        self.unavailable(name, 0, failures)
    }
}

/// The error of a caller of lock `name` whose mode (`asked`) is not the mode its holders use: the
/// lock's key `key` holds `held` (`permits:<N>`, `shared:..`, or an exclusive holder's value).
/// Exclusive and shared holds are the two sides of one read-write lock; permits agree only with
/// the same N.
pub(super) fn other_mode(name: &str, key: &str, asked: HoldKind, held: &str) -> LockError {
    let in_use = match held.strip_prefix(PERMITS_MARK) {
        Some(n) => format!("permits = {n}"),
        None if held.starts_with(SHARED_MARK) => "shared holds".to_owned(),
        None => "an exclusive hold".to_owned(),
    };
    let this = asked.describe();
    let fix = match held.strip_prefix(PERMITS_MARK) {
        Some(n) => format!("give this call permits = {n}"),
        None => "give this call the holders' options (no permits)".to_owned(),
    };
    LockError::config(
        name,
        format!(
            "this call asks for {this}, but the name is held with {in_use} (its key `{key}` \
             holds `{held}`): every caller of one name must use the same mode and N, or they \
             would be inside together; {fix}, or use another name"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mode_conflict_names_the_lock_the_modes_and_the_fix() {
        let cases = [
            (
                HoldKind::Exclusive,
                "permits:3",
                "an exclusive hold",
                "permits = 3",
            ),
            (
                HoldKind::Shared,
                "permits:2",
                "a shared hold",
                "permits = 2",
            ),
            (
                HoldKind::Permits(5),
                "permits:3",
                "permits = 5",
                "permits = 3",
            ),
            (
                HoldKind::Permits(3),
                "shared:abc",
                "permits = 3",
                "shared holds",
            ),
            (
                HoldKind::Permits(3),
                "tok;h=x;p=1;w=0",
                "permits = 3",
                "an exclusive hold",
            ),
        ];
        for (asked, held, this, in_use) in cases {
            let err = other_mode("jobs", "lock:{jobs}", asked, held).to_string();
            assert!(err.contains("jobs"), "{err}");
            assert!(err.contains(&format!("asks for {this}")), "{err}");
            assert!(err.contains(&format!("held with {in_use}")), "{err}");
            assert!(err.contains("`lock:{jobs}`"), "{err}");
            assert!(err.contains("or use another name"), "{err}");
        }
    }
}
