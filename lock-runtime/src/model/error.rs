//! The one error type of the crate.

use std::time::Duration;

use redis::{ErrorKind, ServerErrorKind};

/// Why a lock could not be taken or kept. Every variant made by a lock call names the lock (an
/// error made outside one, connecting or building a locker, has an empty name, which neither
/// its message nor its `Debug` shows), and its message says what to do. Match the variants a caller handles, and keep a catch-all arm: the enum is
/// `#[non_exhaustive]`.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_runtime::{LockError, LockOptions, Locker};
///
/// async fn nightly(locker: &Locker) -> Result<(), LockError> {
///     let opts = LockOptions::new(Duration::from_secs(600));
///     match locker.run("nightly", &opts, async |_lease| { /* the work */ }).await {
///         Ok(()) => Ok(()),
///         // Another instance runs it: nothing to do this time.
///         Err(LockError::Busy { .. }) => Ok(()),
///         // The body was cancelled: another holder may have run at the same time.
///         Err(e @ (LockError::Lost { .. } | LockError::MaxExecExceeded { .. })) => {
///             eprintln!("`{}` did not finish under the lock: {e}", e.lock_name());
///             Err(e)
///         }
///         Err(e) => Err(e),
///     }
/// }
/// ```
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another holder had the lock: the call tried once (`wait` = 0), or `wait` ran out.
    #[error("{}", busy_message(name, *wait))]
    Busy {
        /// The lock's name.
        name: String,
        /// How long this call took, from its start to giving up.
        waited: Duration,
        /// The call's `wait`: zero when it tried once.
        wait: Duration,
    },
    /// The lease was lost while the body ran: the key expired, was deleted or taken over, or
    /// renewal could not be confirmed in time. The body was cancelled, or (found at release,
    /// [`LostReason::GoneAtRelease`]) it had run to its end, partly without the lock.
    #[error(
        "lock `{name}` was lost while held ({reason}); {}. Another holder may have run at the \
         same time: keep bodies shorter than `ttl`, keep the key safe from eviction and \
         failover, and use the fence",
        reason.body_outcome()
    )]
    Lost {
        /// The lock's name.
        name: String,
        /// What was observed.
        reason: LostReason,
        /// The last error of the renewals that failed, for [`LostReason::Unreachable`].
        #[source]
        source: Option<redis::RedisError>,
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
    /// Talking to Redis failed (connection refused, timeout, refused credentials, an error
    /// reply). The message says how, once, and ends with what to do where the error tells; it
    /// has no [`source`](std::error::Error::source), which would say it again.
    #[error("{}Redis at {addr} failed: {error}{}", subject(name), hint(error))]
    Redis {
        /// The lock's name (empty when connecting outside a lock call).
        name: String,
        /// The node's address.
        addr: String,
        /// The underlying error.
        error: redis::RedisError,
    },
    /// The lock's key, or one of the keys kept beside it (its fence counter), holds data this
    /// library cannot use: another client's key under the same name, or a fence counter at the
    /// largest fence. Nothing was changed; nothing is held.
    #[error(
        "{}`{key}` {detail}; it was left untouched: use another lock name or key prefix",
        subject(name)
    )]
    NotALock {
        /// The lock's name.
        name: String,
        /// The Redis key that holds the data.
        key: String,
        /// What it holds.
        detail: String,
    },
    /// A bad URL or a bad option.
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
    /// The release found that the key no longer held this lease's token: it expired, was
    /// deleted (an operator's force-release, eviction, a failover) or was taken over while the
    /// body ran, and no renewal had shown it yet.
    GoneAtRelease,
    /// The lease was released by its holder (seen by a handle that outlived it, such as one a
    /// nested call returned).
    Released,
    /// No renewal was confirmed before the lease's validity (or `max_exec`) ran out, and the
    /// renewals since the last confirmed one failed with server errors: the servers could not be
    /// reached. [`LockError::Lost`] carries the last of those errors as its source.
    Unreachable,
}

impl LostReason {
    /// What became of the body.
    fn body_outcome(&self) -> &'static str {
        match self {
            Self::GoneAtRelease => "the body had run to its end, partly without the lock",
            Self::Released => "the body had finished",
            _ => "the body was cancelled",
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotOwner => "the key no longer holds this lease's token",
            Self::ValidityExpired => "no renewal was confirmed before the lease's validity ran out",
            Self::NotReplicated => {
                "a renewal was not acknowledged by the replicas asked for, so a failover could lose the key"
            }
            Self::GoneAtRelease => {
                "the release found the key no longer holding this lease's token: it expired, was \
                 deleted or was taken over while the body ran"
            }
            Self::Released => "the lease was released",
            Self::Unreachable => {
                "the servers could not be reached to renew the lease (the source is the last \
                 Redis error): check that they are up and reachable; a longer `lease` rides out \
                 a longer outage"
            }
        })
    }
}

/// What a `Busy` call did: tried once, or waited its whole `wait`.
fn busy_message(name: &str, wait: Duration) -> String {
    if wait.is_zero() {
        format!(
            "lock `{name}` is busy: another holder has it, and this call tried once (it has no \
             `wait`); retry later, or give it a `wait`"
        )
    } else {
        format!(
            "lock `{name}` is busy: another holder kept it through this call's whole wait of \
             {}; retry later or raise `wait`",
            duration_text(wait)
        )
    }
}

/// A duration as the options are written: `250ms`, `10s`, `1m 30s`, `2h 5m 1s 500ms`.
fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    let parts = [
        (ms / 3_600_000, "h"),
        (ms / 60_000 % 60, "m"),
        (ms / 1_000 % 60, "s"),
        (ms % 1_000, "ms"),
    ];
    let text: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if text.is_empty() {
        format!("{d:?}")
    } else {
        text.join(" ")
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

/// What to do about a Redis error, as `"; <advice>"` to end its message, or nothing when the error
/// does not tell.
fn hint(error: &redis::RedisError) -> String {
    advice(error.kind(), error.code(), &error.to_string())
        .map(|advice| format!("; {advice}"))
        .unwrap_or_default()
}

/// What to do about a Redis error of this kind, code (`WRONGPASS`, `OOM`..) and text. Only what
/// the error shows: a refused password is not a server that is down, and a server that answers
/// with an error is up.
fn advice(kind: ErrorKind, code: Option<&str>, text: &str) -> Option<&'static str> {
    let code = code.unwrap_or_default();
    if kind == ErrorKind::AuthenticationFailed
        || matches!(code, "WRONGPASS" | "NOAUTH")
        // The server cuts off a client that sends a long command before authenticating.
        || text.contains("unauthenticated")
    {
        return Some(
            "check the user and password in the URL (`redis://user:password@host:port`, or \
             `redis://:password@host:port` for the default user) against the server's \
             `requirepass` or its ACL user (`ACL SETUSER`)",
        );
    }
    if text.contains("SELECT is not allowed in cluster mode") {
        return Some("a Redis Cluster has only database 0: drop the /db from the URLs");
    }
    if text.contains("DB index is out of range")
        || text.contains("invalid DB index")
        || text.contains("refused to switch database")
    {
        return Some(
            "check the /db at the end of the URL: it must be below the server's `databases` \
             setting (16 by default, so /0 to /15)",
        );
    }
    match kind {
        ErrorKind::Server(ServerErrorKind::NoPerm) => {
            return Some(
                "the URL's ACL user may not run this command or touch this key: grant it (`ACL \
                 SETUSER`; `ACL LOG` shows what was refused), or use another user",
            );
        }
        ErrorKind::Server(ServerErrorKind::ReadOnly) => {
            return Some(
                "the server is a read-only replica: point the URL at the primary, or use \
                 `.sentinel(..)` to follow the primary across failovers",
            );
        }
        ErrorKind::Server(ServerErrorKind::BusyLoading) => {
            return Some("the server is still loading its data set: retry once it has loaded");
        }
        ErrorKind::Server(
            ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown | ServerErrorKind::TryAgain,
        ) => {
            return Some(
                "the cluster has no primary for this slot right now (a failover?): retry, and \
                 check `CLUSTER INFO`",
            );
        }
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => {
            return Some("check that the server is up and reachable");
        }
        _ => {}
    }
    match code {
        "OOM" => Some(
            "the server is full (`maxmemory`) and refuses writes: free memory or raise \
             `maxmemory`",
        ),
        "MISCONF" => Some(
            "the server refuses writes because it cannot save its snapshot: fix its disk or \
             persistence settings (see the server's log)",
        ),
        _ => None,
    }
}

fn format_failures(failures: &[(String, String)]) -> String {
    if failures.is_empty() {
        return "none reported".to_owned();
    }
    let parts: Vec<String> = failures.iter().map(|(a, e)| format!("{a}: {e}")).collect();
    parts.join("; ")
}

/// As derived, without the `name` of an error made outside a lock call.
impl std::fmt::Debug for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = |variant: &str, fields: &[(&str, &dyn std::fmt::Debug)]| {
            let mut s = f.debug_struct(variant);
            if !self.lock_name().is_empty() {
                s.field("name", &self.lock_name());
            }
            for (field, value) in fields {
                s.field(field, value);
            }
            s.finish()
        };
        match self {
            Self::Busy {
                name: _,
                waited,
                wait,
            } => out("Busy", &[("waited", waited), ("wait", wait)]),
            Self::Lost {
                name: _,
                reason,
                source,
            } => out("Lost", &[("reason", reason), ("source", source)]),
            Self::MaxExecExceeded { name: _, max_exec } => {
                out("MaxExecExceeded", &[("max_exec", max_exec)])
            }
            Self::QuorumUnavailable {
                name: _,
                got,
                needed,
                failures,
            } => out(
                "QuorumUnavailable",
                &[("got", got), ("needed", needed), ("failures", failures)],
            ),
            Self::NotReplicated {
                name: _,
                addr,
                acked,
                needed,
            } => out(
                "NotReplicated",
                &[("addr", addr), ("acked", acked), ("needed", needed)],
            ),
            Self::Redis {
                name: _,
                addr,
                error,
            } => out("Redis", &[("addr", addr), ("error", error)]),
            Self::NotALock {
                name: _,
                key,
                detail,
            } => out("NotALock", &[("key", key), ("detail", detail)]),
            Self::Config { name: _, message } => out("Config", &[("message", message)]),
        }
    }
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
            | Self::NotALock { name, .. }
            | Self::Config { name, .. } => name,
        }
    }

    /// Whether the servers could not be reached: a connection refused, dropped or timed out, or
    /// too few of Redlock's servers answering for a majority. A busy lock, an error reply
    /// (refused credentials, a key of another type) or a bad option is not.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Redis { error, .. } => {
                error.is_io_error()
                    || error.is_timeout()
                    || error.is_connection_refusal()
                    || error.is_connection_dropped()
            }
            Self::QuorumUnavailable { .. } => true,
            _ => false,
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
            | Self::NotALock { name, .. }
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
            LockError::NotALock { .. } => ErrorKind::AlreadyExists,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, err)
    }
}

/// The URL with any password replaced, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDENTIALS: &str = "check the user and password in the URL";
    const UP: &str = "check that the server is up and reachable";

    /// Errors as redis-rs reports them (kind, code, text) and the advice each should get
    /// (a part of it), or none.
    const ADVICE: &[(ErrorKind, Option<&str>, &str, Option<&str>)] = {
        use ServerErrorKind as S;
        &[
            (
                ErrorKind::AuthenticationFailed,
                None,
                "Password authentication failed - AuthenticationFailed",
                Some(CREDENTIALS),
            ),
            (
                ErrorKind::Extension,
                Some("WRONGPASS"),
                "WRONGPASS invalid username-password pair or user is disabled.",
                Some(CREDENTIALS),
            ),
            (
                ErrorKind::Extension,
                Some("NOAUTH"),
                "\"NOAUTH\": Authentication required.",
                Some(CREDENTIALS),
            ),
            (
                ErrorKind::Server(S::ResponseError),
                Some("ERR"),
                "ResponseError: Protocol error: unauthenticated multibulk length",
                Some(CREDENTIALS),
            ),
            (
                ErrorKind::Server(S::ResponseError),
                Some("ERR"),
                "Redis server refused to switch database - Server(ResponseError): DB index is \
             out of range",
                Some("check the /db at the end of the URL"),
            ),
            (
                ErrorKind::Server(S::ResponseError),
                Some("ERR"),
                "ResponseError: invalid DB index",
                Some("`databases` setting"),
            ),
            (
                ErrorKind::Server(S::ResponseError),
                Some("ERR"),
                "ResponseError: SELECT is not allowed in cluster mode",
                Some("only database 0"),
            ),
            (
                ErrorKind::Server(S::NoPerm),
                Some("NOPERM"),
                "NOPERM User app has no permissions to run the 'evalsha' command",
                Some("ACL SETUSER"),
            ),
            (
                ErrorKind::Server(S::ReadOnly),
                Some("READONLY"),
                "READONLY You can't write against a read only replica.",
                Some("point the URL at the primary"),
            ),
            (
                ErrorKind::Server(S::BusyLoading),
                Some("LOADING"),
                "LOADING Redis is loading the dataset in memory",
                Some("still loading"),
            ),
            (
                ErrorKind::Server(S::ClusterDown),
                Some("CLUSTERDOWN"),
                "CLUSTERDOWN The cluster is down",
                Some("CLUSTER INFO"),
            ),
            (
                ErrorKind::Extension,
                Some("OOM"),
                "OOM command not allowed when used memory > 'maxmemory'.",
                Some("raise `maxmemory`"),
            ),
            (
                ErrorKind::Extension,
                Some("MISCONF"),
                "MISCONF Redis is configured to save RDB snapshots, but it's unable to persist",
                Some("persistence settings"),
            ),
            (
                ErrorKind::Io,
                None,
                "Connection refused (os error 111)",
                Some(UP),
            ),
            (
                ErrorKind::Io,
                None,
                "the server did not answer within 1s",
                Some(UP),
            ),
            (
                ErrorKind::ClusterConnectionNotFound,
                None,
                "no connection to any node",
                Some(UP),
            ),
            // A server that answers with an error is up: no advice it does not fit.
            (
                ErrorKind::Server(S::ResponseError),
                Some("ERR"),
                "ERR Error running script",
                None,
            ),
            (ErrorKind::Extension, Some("BUSYKEY"), "BUSYKEY", None),
            (
                ErrorKind::UnexpectedReturnType,
                None,
                "Response was of incompatible type",
                None,
            ),
        ]
    };

    /// The advice of each error, by kind, code and text: the words it must contain, or `None`
    /// for an error that does not tell what to do.
    #[test]
    fn each_error_gets_advice_that_fits_it() {
        for (kind, code, text, expected) in ADVICE {
            let got = advice(*kind, *code, text);
            match (got, expected) {
                (Some(got), Some(expected)) => assert!(got.contains(expected), "{text}: {got}"),
                (None, None) => {}
                _ => panic!("{text}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn durations_read_as_options_are_written() {
        let ms = Duration::from_millis;
        for (d, text) in [
            (ms(250), "250ms"),
            (ms(10_000), "10s"),
            (ms(90_000), "1m 30s"),
            (ms(3_600_000 + 1_500), "1h 1s 500ms"),
            (Duration::from_micros(336), "336µs"),
        ] {
            assert_eq!(duration_text(d), text);
        }
    }

    /// The message of a real redis-rs error ends with the advice, or with the error itself.
    #[test]
    fn the_message_ends_with_the_advice() {
        let redis = |error: redis::RedisError| LockError::Redis {
            name: "job".to_owned(),
            addr: "127.0.0.1:7000".to_owned(),
            error,
        };
        let refused = redis(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
        assert!(
            refused
                .to_string()
                .ends_with("; check that the server is up and reachable"),
            "{refused}"
        );
        let auth = redis(redis::RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )))
        .to_string();
        assert!(
            auth.starts_with("lock `job`: Redis at 127.0.0.1:7000 failed: Password")
                && auth.contains("; check the user and password in the URL")
                && !auth.contains("up and reachable"),
            "{auth}"
        );
        let other = redis(redis::RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "Response was of incompatible type",
        )))
        .to_string();
        assert!(
            other.ends_with("incompatible type - UnexpectedReturnType"),
            "{other}"
        );
    }
}
