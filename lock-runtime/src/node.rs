//! One Redis server: its command connection and the scripts it runs; its release notifications
//! live in `pubsub`.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{
    ErrorKind, IntoConnectionInfo, ProtocolVersion, RedisResult, Script, ServerErrorKind, Value,
};
use tokio::time::Instant;

use crate::LockError;
use crate::connect::{RoundTrip, Settings, bounded, manager_config, open_client, redact};
use crate::keys::Keys;
use crate::pubsub::{Notifications, Subscription};
use crate::scripts;

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
}

/// A waiter's identity in the queue and the grace it asks for.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub id: String,
    pub grace: Duration,
}

/// How a release goes.
pub(crate) struct Release {
    /// Keep the key this long (`min_hold`); 0 deletes it (or hands it to the first waiter).
    pub keep_ms: u64,
    /// Publish the release even with nobody queued (Redlock: nobody queues).
    pub always_publish: bool,
    /// The fence to record in the counter; 0 when it is recorded already.
    pub record_fence: u64,
    pub fence_retention_ms: u64,
}

/// The reply of the uncontended path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FastReply {
    Taken {
        fence: u64,
    },
    /// Held by someone else.
    Busy,
    /// For the script to tell; `taken` when the plain `SET NX` did set the key.
    Unclear {
        taken: bool,
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
        detail: String,
    },
}

/// One server. `conn` carries commands; `notifications` carries release messages on a RESP3
/// connection of its own.
pub(crate) struct Node {
    addr: String,
    conn: ConnectionManager,
    settings: Settings,
    rtt: Arc<RoundTrip>,
    notifications: Arc<Notifications>,
}

impl Node {
    /// Parses the URL and prepares lazy connections; nothing is sent yet.
    pub(crate) fn new(
        url: &str,
        settings: Settings,
        tls_root_cert: Option<&[u8]>,
    ) -> Result<Self, LockError> {
        let bad = |e: redis::RedisError| {
            let hint = if url.starts_with("rediss://") && cfg!(not(feature = "tls")) {
                "; this build has no TLS support: reach the server over redis:// (e.g. through a TLS tunnel)"
            } else {
                "; expected redis://[user:password@]host:port[/db]"
            };
            LockError::config(
                "",
                format!("invalid Redis URL `{}`: {e}{hint}", redact(url)),
            )
        };
        let info = url.into_connection_info().map_err(bad)?;
        let addr = info.addr().to_string();
        let client = open_client(info.clone(), tls_root_cert).map_err(bad)?;
        let conn = ConnectionManager::new_lazy_with_config(client, manager_config(settings))
            .map_err(bad)?;
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let pubsub_client =
            open_client(info.set_redis_settings(resp3), tls_root_cert).map_err(bad)?;
        let rtt = Arc::new(RoundTrip::default());
        let notifications = Arc::new(Notifications::new(
            addr.clone(),
            pubsub_client,
            settings,
            Arc::clone(&rtt),
        ));
        Ok(Self {
            addr,
            conn,
            settings,
            rtt,
            notifications,
        })
    }

    /// `host:port`, without credentials.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.settings.response_timeout
    }

    /// A recent round trip to this node (the largest of the last few, roughly).
    pub(crate) fn rtt(&self) -> Duration {
        self.rtt.get()
    }

    pub(crate) fn redis_error(&self, name: &str, source: redis::RedisError) -> LockError {
        LockError::Redis {
            name: name.to_owned(),
            addr: self.addr.clone(),
            source,
        }
    }

    /// Sends an EVALSHA built by [`evalsha`]; on NOSCRIPT (a new or restarted server) loads the
    /// script once and sends it again.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        cmd: &redis::Cmd,
        limit: Duration,
    ) -> RedisResult<T> {
        let mut conn = self.conn.clone();
        let call = async {
            match cmd.query_async(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script.prepare_invoke().load_async(&mut conn).await?;
                    cmd.query_async(&mut conn).await
                }
                other => other,
            }
        };
        if limit >= self.settings.response_timeout {
            // The connection already bounds each reply by the response timeout: no second timer.
            call.await
        } else {
            bounded(limit, call).await
        }
    }

    pub(crate) async fn ping(&self) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        let limit = self.settings.connect_timeout + self.settings.response_timeout;
        bounded(limit, redis::cmd("PING").query_async::<()>(&mut conn)).await?;
        // Once connected, one more PING measures the round trip alone.
        let sent = Instant::now();
        bounded(limit, redis::cmd("PING").query_async::<()>(&mut conn)).await?;
        self.rtt.record(sent.elapsed());
        Ok(())
    }

    pub(crate) async fn acquire(
        &self,
        keys: &Keys,
        req: &AcquireRequest<'_>,
    ) -> RedisResult<AcquireReply> {
        let key = &keys.key;
        let mut cmd = evalsha(&scripts::ACQUIRE, 4, 12, 4 * key.len() + 160);
        cmd.arg(key)
            .arg(keys.fence())
            .arg(keys.queue())
            .arg(keys.queue_states());
        // The token is fresh for every attempt: it is also the attempt's nonce in the queue.
        cmd.arg(req.token)
            .arg(req.ttl_ms)
            .arg(req.fence_quantum)
            .arg(req.fence_retention_ms);
        if let Some(waiter) = req.waiter {
            let (evict, seen) = req.evict.unwrap_or(("", ""));
            cmd.arg(&waiter.id)
                .arg(waiter.grace.as_millis() as u64)
                .arg(evict)
                .arg(seen);
        }
        let sent = Instant::now();
        let reply: Vec<Value> = self.eval(&scripts::ACQUIRE, &cmd, req.limit).await?;
        self.rtt.record(sent.elapsed());
        let int = |v: &Value| match v {
            Value::Int(n) => Some(*n),
            _ => None,
        };
        let text = |v: Option<&Value>| v.map(value_text).unwrap_or_default();
        Ok(match reply.first().and_then(int) {
            Some(1) => AcquireReply::Taken {
                fence: reply.get(1).and_then(int).unwrap_or(0) as u64,
            },
            Some(0) => {
                let pttl = reply.get(1).and_then(int).unwrap_or(-1);
                AcquireReply::Busy {
                    pttl: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
                }
            }
            Some(2) => AcquireReply::NotOurTurn {
                head: text(reply.get(1)),
                state: text(reply.get(2)),
            },
            Some(-1) => AcquireReply::Foreign {
                detail: format!(
                    "key `{key}` holds a {} value, not a lock; it was left untouched",
                    text(reply.get(1))
                ),
            },
            _ => AcquireReply::Foreign {
                detail: format!(
                    "fence counter `{}` is not an integer counter ({}); it was left untouched",
                    keys.fence(),
                    text(reply.get(1))
                ),
            },
        })
    }

    /// The uncontended path on one server, in plain commands and one round trip: `SET NX PX GET`
    /// (which also says whether the key was free), the server's clock and the fence counter, and
    /// whether waiters queue (a lock taken from under queued waiters is handed over to them at
    /// once). The fence is `max(counter + 1, clock in µs)`, as the acquire script computes it; the
    /// counter is written at release (see [`scripts::RELEASE`]), while the key is still ours.
    /// Anything unusual (a key or counter of another type, a counter that is not a number) goes
    /// to the script (`Unclear`), which tells what it is.
    pub(crate) async fn acquire_fast(
        &self,
        keys: &Keys,
        token: &str,
        ttl_ms: u64,
        limit: Duration,
    ) -> RedisResult<FastReply> {
        let key = &keys.key;
        // Each command sized up front: no buffer grows on the way.
        let command = |args: usize, bytes: usize| redis::Cmd::with_capacity(args, bytes);
        let mut set = command(7, key.len() + token.len() + 40);
        set.arg("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .arg("GET");
        let mut time = command(1, 4);
        time.arg("TIME");
        let mut counter = command(2, key.len() + 12);
        counter.arg("GET").arg(keys.fence());
        let mut queued = command(2, key.len() + 16);
        queued.arg("EXISTS").arg(keys.queue());
        let mut pipe = redis::Pipeline::with_capacity(4);
        pipe.add_command(set)
            .add_command(time)
            .add_command(counter)
            .add_command(queued);
        let mut conn = self.conn.clone();
        let sent = Instant::now();
        let call = pipe.query_async::<(Option<Value>, (u64, u64), Value, bool)>(&mut conn);
        let replies = if limit >= self.settings.response_timeout {
            call.await
        } else {
            bounded(limit, call).await
        };
        let (previous, (secs, micros), counter, queued) = match replies {
            Ok(replies) => replies,
            // The server answered, with an error (a key of another type): the script tells.
            Err(e) if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) => {
                return Ok(FastReply::Unclear { taken: true });
            }
            Err(e) => return Err(e),
        };
        self.rtt.record(sent.elapsed());
        let counter = match counter {
            Value::Nil => Some(0),
            Value::BulkString(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.parse().ok()),
            _ => None,
        };
        Ok(match (previous, counter) {
            // Free, but waiters queue (the lock expired under them): theirs, not ours.
            (None, _) if queued => FastReply::Unclear { taken: true },
            (None, Some(last)) => FastReply::Taken {
                fence: (last + 1).max(secs * 1_000_000 + micros),
            },
            // Ours, but the counter is not a counter: the script reports it (after a release).
            (None, None) => FastReply::Unclear { taken: true },
            // Held: when it frees, the waiting path asks the script (which knows the PTTL).
            (Some(_), _) => FastReply::Busy,
        })
    }

    /// Takes `waiter` out of the lock's queue (it gave up or was cancelled), and passes on a lock
    /// that was handed to it.
    pub(crate) async fn leave_queue(&self, keys: &Keys, waiter: &str) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("ZREM").arg(keys.queue()).arg(waiter).ignore();
        pipe.cmd("HDEL")
            .arg(keys.queue_states())
            .arg(waiter)
            .ignore();
        bounded(
            self.settings.response_timeout,
            pipe.query_async::<()>(&mut conn),
        )
        .await?;
        // A lock handed to this waiter meanwhile goes on to the next one (or is freed).
        let handed = format!("~{waiter}");
        let how = Release {
            keep_ms: 0,
            always_publish: false,
            record_fence: 0,
            fence_retention_ms: 0,
        };
        self.release(&keys.key, &handed, &how).await.map(|_| ())
    }

    /// Renews many leases in one script call: `(key, token, ttl_ms)` each; true where still ours.
    pub(crate) async fn renew(&self, items: &[(&str, &str, u64)]) -> RedisResult<Vec<bool>> {
        let bytes: usize = items.iter().map(|(k, t, _)| k.len() + t.len() + 40).sum();
        let mut cmd = evalsha(&scripts::RENEW, items.len(), 3 * items.len(), bytes);
        for (key, _, _) in items {
            cmd.arg(*key);
        }
        for (_, token, ttl_ms) in items {
            cmd.arg(*token).arg(*ttl_ms);
        }
        let out: Vec<i64> = self
            .eval(&scripts::RENEW, &cmd, self.settings.response_timeout)
            .await?;
        Ok(out.into_iter().map(|v| v == 1).collect())
    }

    /// Compare-and-delete (or keep for `keep_ms`, or hand over to the first waiter); true when
    /// the key was ours. See [`scripts::RELEASE`].
    pub(crate) async fn release(&self, key: &str, token: &str, how: &Release) -> RedisResult<bool> {
        let mut cmd = evalsha(&scripts::RELEASE, 3, 8, 3 * key.len() + token.len() + 100);
        cmd.arg(key)
            .arg(crate::keys::queue_of(key))
            .arg(crate::keys::fence_of(key))
            .arg(token)
            .arg(how.keep_ms)
            .arg(if how.always_publish { "1" } else { "0" })
            .arg(how.record_fence)
            .arg(how.fence_retention_ms);
        let done: i64 = self
            .eval(&scripts::RELEASE, &cmd, self.settings.response_timeout)
            .await?;
        if done == 1 && how.keep_ms == 0 {
            // Waiters in this process learn it now, not one message later.
            self.notifications.released_here(key);
        }
        Ok(done == 1)
    }

    pub(crate) async fn raise_fence(
        &self,
        keys: &Keys,
        fence: u64,
        retention_ms: u64,
        limit: Duration,
    ) -> RedisResult<()> {
        let mut cmd = evalsha(&scripts::RAISE_FENCE, 1, 3, keys.key.len() + 60);
        cmd.arg(keys.fence()).arg(fence).arg(retention_ms);
        let _: i64 = self.eval(&scripts::RAISE_FENCE, &cmd, limit).await?;
        Ok(())
    }

    /// Sends one plain command (for inspection: reads of a lock's keys), bounded by the response
    /// timeout. Keyed commands reach the server that holds the key.
    #[allow(dead_code)] // used by inspection (next)
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        let mut conn = self.conn.clone();
        bounded(self.settings.response_timeout, cmd.query_async(&mut conn)).await
    }

    /// Up to `limit` keys matching `pattern` (SCAN, in batches of `COUNT 1000`), from every server
    /// that holds keys of this deployment.
    #[allow(dead_code)] // used by inspection (next)
    pub(crate) async fn scan(&self, pattern: &str, limit: usize) -> RedisResult<Vec<String>> {
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        let mut out = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = bounded(
                self.settings.response_timeout,
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn),
            )
            .await?;
            out.extend(keys);
            if next == 0 || out.len() >= limit {
                out.truncate(limit);
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// Subscribes to a release channel of this server (see [`Notifications::subscribe`]).
    pub(crate) async fn subscribe(&self, channel: &str) -> (Subscription, RedisResult<()>) {
        self.notifications.subscribe(channel).await
    }
}

/// `EVALSHA <sha> <numkeys>`; the caller appends the keys, then the arguments (`args` in all,
/// about `bytes` long). Written straight into one buffer sized up front: no copy of every
/// argument (as `ScriptInvocation` makes) and no regrowth on the way.
fn evalsha(script: &Script, numkeys: usize, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(args + 3, bytes + 60);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(numkeys);
    cmd
}

fn value_text(value: &Value) -> String {
    match value {
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::ServerError(e) => format!("{e:?}"),
        other => format!("{other:?}"),
    }
}
