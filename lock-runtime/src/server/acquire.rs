//! One acquire attempt on one server: the acquire script, and the plain-command path of an
//! uncontended call.

use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, Value};
use tokio::time::Instant;

use super::calls::{self, Call};
use super::replies::Attempt;
use super::{Node, Waiter};
use crate::model::keys::{Keys, PERMITS_MARK};
use crate::server::scripts::MAX_FENCE;

/// What one acquire attempt sends besides the keys.
pub(crate) struct AcquireRequest<'a> {
    pub token: &'a str,
    pub ttl_ms: u64,
    /// This caller's place in the queue, if it waits (one node only).
    pub waiter: Option<&'a Waiter>,
    /// A queue head seen unchanged for longer than its grace: `(id, state)`.
    pub evict: Option<(&'a str, &'a str)>,
    /// Fence floor granularity in µs: 1 on one server, 1 s on a Redlock node.
    pub fence_quantum: u64,
    /// How long an unused fence counter is kept; 0 forever.
    pub fence_retention_ms: u64,
    /// Bound on the reply.
    pub limit: Duration,
    /// Whether this server keeps the lock's waiter queue: false on a Redlock node, where nobody
    /// queues (then the attempt sends the leaner `ACQUIRE_UNQUEUED`).
    pub queue: bool,
}

/// The reply of the uncontended path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FastReply {
    Taken {
        fence: u64,
    },
    /// Held by someone else.
    Busy,
    /// Held in another mode: the lock's key holds this value (see [`AcquireReply::OtherMode`]).
    OtherMode {
        held: String,
    },
    /// For the script to tell; `taken` when the plain `SET NX` did set the key.
    Unclear {
        taken: bool,
    },
    /// Taken, but fewer replicas than asked acknowledged it in time; the key was deleted again.
    NotReplicated {
        acked: usize,
    },
}

/// The reply to an acquire attempt on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    Taken {
        fence: u64,
    },
    /// Held by someone else; the remaining PTTL when the key has one.
    Busy {
        pttl: Option<Duration>,
    },
    /// Free, but another waiter is first in line: its id and its state (nonce and grace).
    NotOurTurn {
        head: String,
        state: String,
    },
    /// The lock key, or its fence counter, holds data that is not ours; nothing was changed.
    Foreign {
        key: String,
        detail: String,
    },
    /// Taken, but fewer replicas than asked acknowledged it in time; the key was deleted again.
    NotReplicated {
        acked: usize,
    },
    /// Held in another mode than this caller's: the lock's key holds `held` (`permits:<N>`,
    /// `shared:..`, or an exclusive holder's value). Nothing was changed.
    OtherMode {
        held: String,
    },
}

impl AcquireReply {
    /// What an acquire script's reply says, its replicas' acknowledgements aside.
    pub(super) fn of(keys: &Keys, attempt: Attempt) -> Self {
        match attempt {
            Attempt::Taken { fence, .. } => AcquireReply::Taken { fence },
            Attempt::Busy { pttl } => AcquireReply::Busy { pttl },
            Attempt::NotOurTurn { head, state } => AcquireReply::NotOurTurn { head, state },
            // The lock's key, or (named) a derived key that holds another type.
            Attempt::WrongType { found, key } => AcquireReply::Foreign {
                key: key.unwrap_or_else(|| keys.key.clone()),
                detail: format!("holds a {found} value, not a lock"),
            },
            Attempt::Unusable { why } => AcquireReply::Foreign {
                key: keys.fence().to_string(),
                detail: why,
            },
            Attempt::OtherMode { held } => AcquireReply::OtherMode { held },
        }
    }
}

impl Node {
    pub(crate) async fn acquire(
        &self,
        keys: &Keys,
        req: &AcquireRequest<'_>,
    ) -> RedisResult<AcquireReply> {
        let unqueued = !req.queue && req.waiter.is_none();
        // The token is fresh for every attempt: it is also the attempt's nonce in the queue.
        let (script, cmd) = if unqueued {
            let call = calls::AcquireUnqueued { keys, req };
            (call.script(), call.command())
        } else {
            let call = calls::Acquire { keys, req };
            (call.script(), call.command())
        };
        let sent = Instant::now();
        let wait = self.wait_cmd(req.ttl_ms, req.limit);
        let (reply, acked): (Attempt, _) =
            self.eval(script, &cmd, wait.as_ref(), req.limit).await?;
        self.rtt.record(sent.elapsed());
        let replicated = match (&reply, acked) {
            (Attempt::Taken { .. }, Some(acked)) if acked < self.replicas => Some(acked),
            _ => None,
        };
        if let Some(acked) = replicated {
            Box::pin(self.undo_unreplicated(keys, req.token)).await;
            return Ok(AcquireReply::NotReplicated { acked });
        }
        Ok(AcquireReply::of(keys, reply))
    }

    /// An attempt on a server that keeps no waiter queue (a Redlock node) by a caller that cannot
    /// read the fence: `SET NX PX GET` and the key's `PTTL` in one round trip, no script, and
    /// fence 0 (a nested call that can read it computes it then, see `Deployment::fence_for`).
    /// A key of another type goes to `ACQUIRE_UNQUEUED`, which names it and changes nothing.
    pub(crate) async fn acquire_unfenced(
        &self,
        keys: &Keys,
        req: &AcquireRequest<'_>,
    ) -> RedisResult<AcquireReply> {
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.add_command(take_command(&keys.key, req.token, req.ttl_ms))
            .cmd("PTTL")
            .arg(&keys.key);
        if let Some(wait) = self.wait_cmd(req.ttl_ms, req.limit) {
            pipe.add_command(wait);
        }
        let sent = Instant::now();
        let mut conn = self.conn().await?;
        let replies = self
            .bounded(req.limit, pipe.query_async::<Vec<Value>>(&mut conn))
            .await;
        let replies = match replies {
            Ok(replies) => replies,
            // The server answered with an error: the `SET` met a key of another type and set
            // nothing (`PTTL` and `WAIT` do not fail). The script tells what the key holds.
            Err(e) if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) => {
                return Box::pin(self.acquire(keys, req)).await;
            }
            Err(e) => return Err(e),
        };
        self.rtt.record(sent.elapsed());
        let unexpected = || RedisError::from((ErrorKind::Parse, "unexpected acquire replies"));
        let mut replies = replies.into_iter();
        let (set, pttl) = (replies.next(), replies.next());
        let (Some(set), Some(Value::Int(pttl))) = (set, pttl) else {
            return Err(unexpected());
        };
        if set != Value::Nil {
            return Ok(match FastReply::held(set) {
                FastReply::OtherMode { held } => AcquireReply::OtherMode { held },
                // No expiry (-1): a key this library did not set; gone since the `SET` (-2):
                // free again, try at once.
                _ => AcquireReply::Busy {
                    pttl: (pttl != -1).then(|| Duration::from_millis(pttl.max(0) as u64)),
                },
            });
        }
        if let Some(acked) = replies.next() {
            let acked: usize = redis::from_redis_value(acked).map_err(|_| unexpected())?;
            if acked < self.replicas {
                Box::pin(self.undo_unreplicated(keys, req.token)).await;
                return Ok(AcquireReply::NotReplicated { acked });
            }
        }
        Ok(AcquireReply::Taken { fence: 0 })
    }

    /// A key taken without the replicas' acknowledgement is deleted at once (compare-and-delete):
    /// a failover could lose it and let a second holder in.
    async fn undo_unreplicated(&self, keys: &Keys, token: &str) {
        if let Err(e) = self.release(keys, token, &self.undo()).await {
            tracing::debug!(target: "lock_runtime::acquire", node = %self.addr, key = %keys.key, error = %e, "deleting an unacknowledged key failed; it expires by its ttl");
        }
    }

    /// The uncontended path on one server, in plain commands and one round trip: `SET NX PX GET`
    /// (which also says whether the key was free, and fails on a key of another type); with
    /// `fenced`, the server's clock and the fence counter too. The fence is `max(counter + 1,
    /// clock in µs)`, as the acquire script computes it; the counter is written at release (see
    /// [`super::scripts::RELEASE`]), while the key is still ours. Without `fenced` (nobody can read the
    /// fence) the fence is 0, and without replicas to wait for the `SET` goes alone, as one
    /// command. Anything unusual (a key or counter of another type, a counter that is not a
    /// number) goes to the script (`Unclear`), which tells what it is.
    ///
    /// The queue is not looked at: a key that is free has nobody queued behind it, except
    /// between its expiry under queued waiters (a holder or grantee that died, a `min_hold` run
    /// out) and the first waiter's next attempt (at the expiry, or within a third of its grace).
    /// A call that takes the key then cuts in; the next waiter's attempt marks its value, and
    /// its release grants the lock to the first waiter (see `scripts::ACQUIRE`).
    ///
    /// Not bounded here: its one caller bounds the whole attempt, this request included (see
    /// `Deployment::attempt_bound`), so the request needs no timer of its own. `sent`: when that
    /// attempt began, which the round trip recorded here counts from (no clock read of its own).
    pub(crate) async fn acquire_fast(
        &self,
        keys: &Keys,
        token: &str,
        ttl_ms: u64,
        fenced: bool,
        sent: Instant,
    ) -> RedisResult<FastReply> {
        let key = &keys.key;
        // Each command sized up front: no buffer grows on the way.
        let command = |args: usize, bytes: usize| redis::Cmd::with_capacity(args, bytes);
        let set = take_command(key, token, ttl_ms);
        let wait = self.wait_cmd(ttl_ms, self.settings.response_timeout);
        let waits = wait.is_some();
        let alone = !fenced && !waits;
        let mut conn = self.conn().await?;
        let replies = if alone {
            self.link
                .watch_for_failover(set.query_async::<Value>(&mut conn))
                .await
                .map(Replies::One)
        } else {
            let mut pipe = redis::Pipeline::with_capacity(4);
            pipe.add_command(set);
            if fenced {
                let mut time = command(1, 4);
                time.arg("TIME");
                let mut counter = command(2, key.len() + 12);
                counter.arg("GET").arg(keys.fence());
                pipe.add_command(time).add_command(counter);
            }
            if let Some(wait) = wait {
                pipe.add_command(wait);
            }
            self.link
                .watch_for_failover(pipe.query_async::<Vec<Value>>(&mut conn))
                .await
                .map(Replies::Many)
        };
        let replies = match replies {
            Ok(replies) => replies,
            // The server answered, with an error (a key of another type): the script tells. The
            // SET alone did not go through; in a pipeline, it may have.
            Err(e) if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) => {
                return Ok(FastReply::Unclear { taken: !alone });
            }
            Err(e) => return Err(e),
        };
        self.rtt.record(sent.elapsed());
        let parsed = FastReplies::parse(replies, fenced, waits)
            .ok_or_else(|| RedisError::from((ErrorKind::Parse, "unexpected acquire replies")))?;
        if parsed.previous.is_none()
            && let Some(acked) = parsed.acked
            && acked < self.replicas
        {
            // Boxed (rare): the uncontended path's future stays small.
            Box::pin(self.undo_unreplicated(keys, token)).await;
            return Ok(FastReply::NotReplicated { acked });
        }
        Ok(match (parsed.previous, parsed.fence) {
            (None, Some(fence)) => FastReply::Taken { fence },
            // Ours, but the counter is not a counter: the script reports it (after a release).
            (None, None) => FastReply::Unclear { taken: true },
            (Some(previous), _) => FastReply::held(previous),
        })
    }
}

/// `SET <key> <token> NX PX <ttl_ms> GET`, sized up front: takes the key if it is free, and
/// says what it held otherwise.
fn take_command(key: &str, token: &str, ttl_ms: u64) -> redis::Cmd {
    let mut set = redis::Cmd::with_capacity(7, key.len() + token.len() + 40);
    set.arg("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .arg("GET");
    set
}

impl FastReply {
    /// The reply of a `SET NX` that found the key held, with this value.
    fn held(previous: Value) -> Self {
        match previous {
            // Held by permits: another mode (the value is read only on this rare path).
            Value::BulkString(held) if held.starts_with(PERMITS_MARK.as_bytes()) => {
                FastReply::OtherMode {
                    held: String::from_utf8_lossy(&held).into_owned(),
                }
            }
            // Held: when it frees, the waiting path asks the script (which knows the PTTL).
            _ => FastReply::Busy,
        }
    }
}

/// The replies of the uncontended path: the `SET`'s alone, or the pipeline's.
enum Replies {
    One(Value),
    Many(Vec<Value>),
}

/// The replies of the uncontended path, in the order sent.
struct FastReplies {
    /// The key's value before the `SET NX` (none: it was free and is ours now).
    previous: Option<Value>,
    /// The fence (0 when not asked for); none when the counter is not a number.
    fence: Option<u64>,
    acked: Option<usize>,
}

impl FastReplies {
    fn parse(replies: Replies, fenced: bool, waits: bool) -> Option<Self> {
        // The SET's reply, then the pipeline's others (none when the SET went alone: then
        // neither a fence nor acknowledgements were asked for).
        let (set, mut replies) = match replies {
            Replies::One(set) => (set, Vec::new().into_iter()),
            Replies::Many(replies) => {
                let mut replies = replies.into_iter();
                (replies.next()?, replies)
            }
        };
        let previous = match set {
            Value::Nil => None,
            other => Some(other),
        };
        let fence = if fenced {
            let (secs, micros): (u64, u64) = redis::from_redis_value(replies.next()?).ok()?;
            let counter = match replies.next()? {
                Value::Nil => Some(0),
                Value::BulkString(bytes) => std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    // At the largest fence: the script reports it.
                    .filter(|&last| last < MAX_FENCE),
                _ => None,
            };
            counter.map(|last| (last + 1).max(secs * 1_000_000 + micros))
        } else {
            Some(0)
        };
        let acked = match waits {
            true => Some(redis::from_redis_value(replies.next()?).ok()?),
            false => None,
        };
        Some(Self {
            previous,
            fence,
            acked,
        })
    }
}
