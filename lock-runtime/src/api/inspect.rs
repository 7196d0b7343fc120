//! Who holds a lock, since when, and who waits: `Locker::inspect`, `Locker::list`, and the
//! operator's compare-and-delete, `Locker::force_release`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::model::keys::Keys;
use crate::server::Node;
use crate::{Holder, LockError, Locker};

/// Most locks [`Locker::list`] returns.
pub const LIST_LIMIT: usize = 1000;

/// What a lock's keys say at one moment (see [`Locker::inspect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// Its Redis key.
    pub key: String,
    /// The key's value, as stored: what [`Locker::force_release`] compares.
    pub value: String,
    /// Who took it, when the value is one this library wrote.
    pub holder: Option<Holder>,
    /// Held, kept for `min_hold`, handed to a waiter, or written by another client.
    pub state: LockState,
    /// The last fence recorded in the lock's counter. A lease taken on the uncontended path
    /// records its fence when it is released, so while such a lease is held this is the fence
    /// before it (the holder's own is higher).
    pub fence: Option<u64>,
    /// How long until the key expires if nobody renews it.
    pub ttl_left: Option<Duration>,
    /// The callers queued for it, first in line first (one server; Redlock does not queue).
    pub waiters: Vec<Waiting>,
}

/// One caller in a lock's waiter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiting {
    /// Its id in the queue.
    pub id: String,
    /// Who it is, read from its id.
    pub holder: Option<Holder>,
}

/// How a lock's key is held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockState {
    /// By a lease of this library (see [`LockInfo::holder`]).
    Held,
    /// Released, but kept until its `min_hold` is over (no lease renews it).
    MinHold,
    /// Released to the first waiter, for that waiter's grace, until it takes it.
    HandedOver {
        /// The waiter's id.
        to: String,
    },
    /// By a value this library did not write (another client on the same key).
    Foreign,
}

impl LockInfo {
    fn read(
        name: &str,
        key: &str,
        value: String,
        pttl: i64,
        fence: Option<String>,
        queue: Vec<String>,
    ) -> Self {
        let (state, holder) = if let Some(to) = value.strip_prefix('~') {
            let holder = Holder::parse(to);
            (LockState::HandedOver { to: to.to_owned() }, holder)
        } else if let Some(released) = value.strip_suffix(":released")
            && let Some(holder) = Holder::parse(released)
        {
            (LockState::MinHold, Some(holder))
        } else if let Some(holder) = Holder::parse(&value) {
            (LockState::Held, Some(holder))
        } else {
            (LockState::Foreign, None)
        };
        Self {
            name: name.to_owned(),
            key: key.to_owned(),
            value,
            holder,
            state,
            fence: fence.and_then(|f| f.parse().ok()),
            ttl_left: u64::try_from(pttl).ok().map(Duration::from_millis),
            waiters: queue
                .into_iter()
                .map(|id| Waiting {
                    holder: Holder::parse(&id),
                    id,
                })
                .collect(),
        }
    }
}

/// One server's view of a lock: `(value, pttl, fence counter, queue)`, or `None` if free.
type View = Option<(String, i64, Option<String>, Vec<String>)>;

/// Reads one server's view. Each reply is read on its own: a key of another type where a
/// counter or a queue should be (another client's) reads as none, not as an error.
async fn view(node: &Node, keys: &Keys) -> Result<View, LockError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors()
        .cmd("GET")
        .arg(&keys.key)
        .cmd("PTTL")
        .arg(&keys.key)
        .cmd("GET")
        .arg(keys.fence())
        .cmd("ZRANGE")
        .arg(keys.queue())
        .arg(0)
        .arg(-1);
    let replies: Vec<redis::RedisResult<Value>> = node
        .query_pipeline(&pipe)
        .await
        .map_err(|e| node.redis_error("", e))?;
    let mut replies = replies.into_iter();
    let value = replies.next();
    let mut next = || replies.next().and_then(|r| r.ok());
    let (pttl, fence, queue) = (next(), next(), next());
    fn read<T: redis::FromRedisValue>(v: Option<Value>) -> Option<T> {
        v.and_then(|v| redis::from_redis_value(v).ok())
    }
    let pttl: i64 = read(pttl).unwrap_or(-1);
    let (fence, queue) = (read(fence), read(queue).unwrap_or_default());
    Ok(match value {
        None | Some(Ok(Value::Nil)) => None,
        Some(Ok(Value::BulkString(b))) => {
            Some((String::from_utf8_lossy(&b).into_owned(), pttl, fence, queue))
        }
        // Not a string key (`GET` refused it): not a lock this library could hold.
        Some(_) => Some(("(not a string)".to_owned(), pttl, fence, queue)),
    })
}

impl Locker {
    /// Who holds the lock `name` now: its holder (host, process id, label), the last fence
    /// recorded, the time left on its key, and its waiters in order; `None` when it is free.
    /// On Redlock, the value a majority of nodes hold (with the least time left among them).
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>, LockError> {
        let key = self.key_of(name);
        let deployment = &self.acquirer().deployment;
        let keys = deployment.keys(key.clone());
        let views = crate::plumbing::fanout::join_all_values(
            deployment.nodes().iter().map(|n| view(n, &keys)),
        )
        .await;
        let mut held: HashMap<String, (usize, i64, Vec<String>)> = HashMap::new();
        let mut fence: Option<String> = None;
        let mut answered = 0;
        let mut last_error = None;
        for v in views {
            match v {
                Ok(v) => {
                    answered += 1;
                    if let Some((value, pttl, f, queue)) = v {
                        if f.as_ref().and_then(|f| f.parse::<u64>().ok())
                            > fence.as_ref().and_then(|f| f.parse::<u64>().ok())
                        {
                            fence = f;
                        }
                        let entry = held.entry(value).or_insert((0, i64::MAX, queue));
                        entry.0 += 1;
                        entry.1 = entry.1.min(pttl);
                    }
                }
                Err(e) => last_error = Some(e),
            }
        }
        if answered < deployment.needed() {
            return Err(last_error.map_or_else(
                || LockError::config(name, "no node answered"),
                |e| e.for_lock(name),
            ));
        }
        let best = held.into_iter().max_by_key(|(_, (count, _, _))| *count);
        Ok(best
            .filter(|(_, (count, _, _))| *count >= deployment.needed())
            .map(|(value, (_, pttl, queue))| LockInfo::read(name, &key, value, pttl, fence, queue)))
    }

    /// The locks whose names match `pattern` (a Redis glob: `*`, `?`, `[..]`) held now, at most
    /// [`LIST_LIMIT`], sorted by name. Keys are found with `SCAN` on every primary (no `KEYS`),
    /// then each is inspected.
    pub async fn list(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        let glob = self.key_format().glob(self.prefix(), pattern);
        let deployment = Arc::clone(&self.acquirer().deployment);
        let mut names = std::collections::BTreeSet::new();
        for node in deployment.nodes() {
            let keys = node
                .scan(&glob, LIST_LIMIT)
                .await
                .map_err(|e| node.redis_error("", e))?;
            names.extend(keys.into_iter().filter_map(|k| self.name_of(&k)));
        }
        let mut out = Vec::new();
        for name in names.into_iter().take(LIST_LIMIT) {
            if let Some(info) = self.inspect(&name).await? {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Deletes the lock `name`'s key, but only while its value is still `value` (the one an
    /// operator saw in [`inspect`](Self::inspect)): compare-and-delete on every node, then its
    /// waiters are woken (the first in line gets it). `Ok(false)` when the value changed
    /// meanwhile (nothing was touched). The holder, if alive, learns at its next renewal that
    /// it lost the lock, and its body is cancelled.
    pub async fn force_release(&self, name: &str, value: &str) -> Result<bool, LockError> {
        let deployment = &self.acquirer().deployment;
        let keys = deployment.keys(self.key_of(name));
        deployment.force_release(name, &keys, value).await
    }

    /// The lock name of a key of this locker, `None` for its other keys (fence, queue).
    fn name_of(&self, key: &str) -> Option<String> {
        self.key_format().name_of(self.prefix(), key)
    }
}
