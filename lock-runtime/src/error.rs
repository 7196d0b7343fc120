//! The one error type of the crate.

use std::time::Duration;

/// Why a lock could not be taken or kept. Every variant names the lock.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another holder had the lock and `wait` ran out.
    #[error(
        "lock `{name}` is busy: another holder kept it for the whole wait of {waited:?}; \
         retry later or raise `wait`"
    )]
    Busy {
        /// The lock's name.
        name: String,
        /// How long this call waited.
        waited: Duration,
    },
    /// The lease ended before the body finished: the key expired, was deleted or taken over,
    /// or renewal could not be confirmed in time. The body was cancelled.
    #[error(
        "lock `{name}` was lost while held ({reason}); the body was cancelled. \
         Another holder may have run: keep bodies shorter than `ttl` and use the fence"
    )]
    Lost {
        /// The lock's name.
        name: String,
        /// What was observed.
        reason: LostReason,
    },
    /// The body ran past `max_exec` and was cancelled.
    #[error(
        "lock `{name}`: the body ran past max_exec = {max_exec:?} and was cancelled; \
         raise `max_exec` (and `ttl`) or make the body faster"
    )]
    MaxExecExceeded {
        /// The lock's name.
        name: String,
        /// The limit that was hit.
        max_exec: Duration,
    },
    /// Fewer than a majority of the Redlock nodes answered yes.
    #[error(
        "lock `{name}`: only {got} of the {needed} nodes needed for a majority granted it; \
         failures: {}",
        format_failures(failures)
    )]
    QuorumUnavailable {
        /// The lock's name.
        name: String,
        /// Nodes that granted the lock.
        got: usize,
        /// Nodes needed (N/2 + 1 of the configured N).
        needed: usize,
        /// Each node that failed, by address, and why.
        failures: Vec<(String, String)>,
    },
    /// The primary took the lock, but fewer of its replicas than `replicas(n)` asks for
    /// acknowledged it in time (`WAIT`), so a failover could have lost it. The key was deleted
    /// again; nothing is held.
    #[error(
        "lock `{name}`: only {acked} of the {needed} replica(s) asked for acknowledged it on \
         {addr}, so a failover could lose it; the key was deleted again. Check the replicas \
         (INFO replication), or lower `replicas(..)`"
    )]
    NotReplicated {
        /// The lock's name.
        name: String,
        /// The primary (or deployment) that took it.
        addr: String,
        /// Replicas that acknowledged.
        acked: usize,
        /// Replicas asked for.
        needed: usize,
    },
    /// Talking to Redis failed (connection refused, timeout, unexpected reply).
    #[error(
        "{}Redis at {addr} failed: {source}; check that the server is up and reachable",
        subject(name)
    )]
    Redis {
        /// The lock's name (empty when connecting outside a lock call).
        name: String,
        /// The node's address.
        addr: String,
        /// The underlying error.
        #[source]
        source: redis::RedisError,
    },
    /// A bad URL, a bad option, or a lock key holding data that is not a lock.
    #[error("{}{message}", subject(name))]
    Config {
        /// The lock's name (empty for locker-wide settings).
        name: String,
        /// What is wrong and what to do.
        message: String,
    },
}

/// What showed that a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// Redis said the key no longer holds our token (expired, deleted or taken over).
    NotOwner,
    /// No renewal was confirmed before the lease's local validity ran out.
    ValidityExpired,
    /// A renewal was applied by the primary but not acknowledged by the replicas that
    /// `replicas(n)` asks for: a failover could lose the key.
    NotReplicated,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotOwner => "the key no longer holds this lease's token",
            Self::ValidityExpired => "no renewal was confirmed before the lease's validity ran out",
            Self::NotReplicated => {
                "a renewal was not acknowledged by the replicas asked for, so a failover could lose the key"
            }
        })
    }
}

/// "lock `name`: ", or nothing for errors outside a lock call (building a locker).
fn subject(name: &str) -> String {
    if name.is_empty() {
        String::new()
    } else {
        format!("lock `{name}`: ")
    }
}

fn format_failures(failures: &[(String, String)]) -> String {
    if failures.is_empty() {
        return "none reported".to_owned();
    }
    let parts: Vec<String> = failures.iter().map(|(a, e)| format!("{a}: {e}")).collect();
    parts.join("; ")
}

impl LockError {
    /// The name of the lock this error is about.
    pub fn lock_name(&self) -> &str {
        match self {
            Self::Busy { name, .. }
            | Self::Lost { name, .. }
            | Self::MaxExecExceeded { name, .. }
            | Self::QuorumUnavailable { name, .. }
            | Self::NotReplicated { name, .. }
            | Self::Redis { name, .. }
            | Self::Config { name, .. } => name,
        }
    }

    /// The same error about lock `name` (errors made outside a lock call have no name yet).
    pub(crate) fn for_lock(mut self, lock: &str) -> Self {
        match &mut self {
            Self::Busy { name, .. }
            | Self::Lost { name, .. }
            | Self::MaxExecExceeded { name, .. }
            | Self::QuorumUnavailable { name, .. }
            | Self::NotReplicated { name, .. }
            | Self::Redis { name, .. }
            | Self::Config { name, .. } => {
                if name.is_empty() {
                    lock.clone_into(name);
                }
            }
        }
        self
    }

    pub(crate) fn config(name: &str, message: impl Into<String>) -> Self {
        Self::Config {
            name: name.to_owned(),
            message: message.into(),
        }
    }
}

impl From<LockError> for std::io::Error {
    fn from(err: LockError) -> Self {
        use std::io::ErrorKind;
        let kind = match &err {
            LockError::Busy { .. } => ErrorKind::WouldBlock,
            LockError::MaxExecExceeded { .. } => ErrorKind::TimedOut,
            LockError::Lost { .. } => ErrorKind::Interrupted,
            LockError::Config { .. } => ErrorKind::InvalidInput,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, err)
    }
}
