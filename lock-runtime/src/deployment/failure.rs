//! Why a deployment could not serve a request, said as one error.

use std::time::Duration;

use super::Deployment;
use crate::LockError;

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
