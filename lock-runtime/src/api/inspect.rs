//! Who holds a lock, since when, and who waits: `Locker::inspect`, `Locker::list`, and the
//! operator's compare-and-delete, `Locker::force_release`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::deployment::Node;
use crate::model::keys::{HANDED_MARK, KEPT_MARK, Keys, SHARED_MARK};
use crate::{Holder, LockError, Locker};

/// Most locks [`Locker::list`] returns.
pub const LIST_LIMIT: usize = 1000;

/// What a lock's keys say at one moment (see [`Locker::inspect`]).
///
/// An exclusive lock has one holder; a shared hold of a read-write lock and a lock with
/// `permits = N` may have several, all in [`holders`](Self::holders). `value`, `holder` and
/// `ttl_left` describe the lock's key when it is set (an exclusive or a shared hold), else the
/// first held permit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// Its Redis key (a lock with permits holds its permits' keys instead, see
    /// [`Holding::permit`]).
    pub key: String,
    /// The key's value, as stored: what [`Locker::force_release`] compares. For a lock with
    /// permits, the first held permit's value; for a shared hold, `shared:` and the value of its
    /// first holder.
    pub value: String,
    /// Who took it, when the value is one this library wrote (for a shared hold, its first
    /// holder).
    pub holder: Option<Holder>,
    /// Held, shared, kept for `min_hold`, handed to a waiter, or written by another client.
    pub state: LockState,
    /// The last fence recorded in the lock's counter. A lease taken on the uncontended path
    /// records its fence when it is released, so while such a lease is held this is the fence
    /// before it (the holder's own is higher).
    pub fence: Option<u64>,
    /// How long until the key expires if nobody renews it.
    pub ttl_left: Option<Duration>,
    /// The callers queued for it, first in line first (one server; Redlock does not queue).
    pub waiters: Vec<Waiting>,
    /// Every holder: the one of an exclusive lock (in whatever [`state`](Self::state)), each
    /// shared holder (by fence), or each held permit (by permit). Never empty.
    pub holders: Vec<Holding>,
    /// N, for a name whose holders agreed on `permits = N` (kept as long as its fence counter).
    pub permits: Option<u32>,
}

/// One holder of a lock: its exclusive holder, one of its shared holders, or the holder of one
/// of its permits.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holding {
    /// Its value, as stored: in the lock's key or its permit's key, or (a shared holder) in the
    /// set of shared holders. [`Locker::force_release`] takes an exclusive holder's or a
    /// permit's.
    pub value: String,
    /// Who it is, when the value is one this library wrote.
    pub holder: Option<Holder>,
    /// Whether it is one of the shared holders of a read-write lock.
    pub shared: bool,
    /// The permit it holds (0 to N - 1), in a lock with `permits = N`.
    pub permit: Option<u32>,
    /// Its fence, where the keys keep it apart: a shared holder's. An exclusive holder's or a
    /// permit's is not kept apart from the counter ([`LockInfo::fence`]).
    pub fence: Option<u64>,
    /// How long until its key expires if nobody renews it (a shared holder: the shared hold's).
    pub ttl_left: Option<Duration>,
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
    /// By a lease of this library (see [`LockInfo::holder`]), or permits by leases.
    Held,
    /// By the shared holders of a read-write lock (see [`LockInfo::holders`]).
    Shared,
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

/// The state a key's value (or a permit's) says, and who wrote it.
fn state_of(value: &str) -> (LockState, Option<Holder>) {
    if let Some(to) = value.strip_prefix(HANDED_MARK) {
        (
            LockState::HandedOver { to: to.to_owned() },
            Holder::parse(to),
        )
    } else if let Some(first) = value.strip_prefix(SHARED_MARK) {
        (LockState::Shared, Holder::parse(first))
    } else if let Some(released) = value.strip_suffix(KEPT_MARK)
        && let Some(holder) = Holder::parse(released)
    {
        (LockState::MinHold, Some(holder))
    } else if let Some(holder) = Holder::parse(value) {
        (LockState::Held, Some(holder))
    } else {
        (LockState::Foreign, None)
    }
}

/// A time left as `PTTL` gives it; none for no expiry (-1) or no key (-2).
fn ttl(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

impl LockInfo {
    /// The lock as its key's `value` says (an exclusive or a shared hold), with the shared
    /// holders and the count of permits of `view`.
    fn of_key(name: &str, key: &str, value: String, pttl: i64, view: View) -> Self {
        let (state, holder) = state_of(&value);
        let holders = if state != LockState::Shared {
            vec![Holding {
                value: value.clone(),
                holder: holder.clone(),
                shared: false,
                permit: None,
                fence: None,
                ttl_left: ttl(pttl),
            }]
        } else if view.readers.is_empty() {
            // The key names its first shared holder even when the set cannot be read.
            let first = value[SHARED_MARK.len()..].to_owned();
            vec![Holding::shared(first, None, pttl)]
        } else {
            let readers = view.readers.into_iter();
            readers
                .map(|(member, fence)| Holding::shared(member, fence, pttl))
                .collect()
        };
        Self {
            name: name.to_owned(),
            key: key.to_owned(),
            value,
            holder,
            state,
            fence: view.fence,
            ttl_left: ttl(pttl),
            waiters: waiting(view.queue),
            holders,
            permits: view.permits,
        }
    }

    /// A lock with permits, from the permits `view` found held; `None` when none is.
    fn of_permits(name: &str, key: &str, view: View) -> Option<Self> {
        let holders: Vec<Holding> = view
            .held
            .into_iter()
            .map(|(permit, value, pttl)| Holding {
                holder: state_of(&value).1,
                value,
                shared: false,
                permit: Some(permit),
                fence: None,
                ttl_left: ttl(pttl),
            })
            .collect();
        let first = holders.first()?;
        let (state, holder) = state_of(&first.value);
        Some(Self {
            name: name.to_owned(),
            key: key.to_owned(),
            value: first.value.clone(),
            holder,
            state,
            fence: view.fence,
            ttl_left: first.ttl_left,
            waiters: waiting(view.queue),
            permits: view.permits,
            holders,
        })
    }
}

impl Holding {
    /// A shared holder, whose time left is the shared hold's.
    fn shared(value: String, fence: Option<u64>, pttl: i64) -> Self {
        Self {
            holder: Holder::parse(&value),
            value,
            shared: true,
            permit: None,
            fence,
            ttl_left: ttl(pttl),
        }
    }
}

/// The queue's ids, as waiters.
fn waiting(queue: Vec<String>) -> Vec<Waiting> {
    queue
        .into_iter()
        .map(|id| Waiting {
            holder: Holder::parse(&id),
            id,
        })
        .collect()
}

/// One server's view of a lock's keys.
#[derive(Debug, Default)]
struct View {
    /// The key's value and `PTTL`, when it is set.
    key: Option<(String, i64)>,
    /// The last fence recorded.
    fence: Option<u64>,
    /// The waiter queue, first in line first.
    queue: Vec<String>,
    /// N, when the name's holders agreed on `permits = N`.
    permits: Option<u32>,
    /// The shared holders and their fences, by fence.
    readers: Vec<(String, Option<u64>)>,
    /// The held permits: number, value and `PTTL`.
    held: Vec<(u32, String, i64)>,
}

/// What a string reply says; another type of key (`GET` refused it) is not a lock this library
/// could hold.
fn text_of(reply: Option<redis::RedisResult<Value>>) -> Option<String> {
    match reply {
        None | Some(Ok(Value::Nil)) => None,
        Some(Ok(Value::BulkString(b))) => Some(String::from_utf8_lossy(&b).into_owned()),
        Some(Ok(Value::SimpleString(s))) => Some(s),
        Some(_) => Some("(not a string)".to_owned()),
    }
}

fn read<T: redis::FromRedisValue>(v: Option<redis::RedisResult<Value>>) -> Option<T> {
    v.and_then(Result::ok)
        .and_then(|v| redis::from_redis_value(v).ok())
}

/// Reads one server's view. Each reply is read on its own: a key of another type where a
/// counter, a queue or a set should be (another client's) reads as none, not as an error.
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
        .arg(-1)
        .cmd("ZRANGE")
        .arg(keys.readers())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("TIME");
    let replies: Vec<redis::RedisResult<Value>> = node
        .query_pipeline(&pipe)
        .await
        .map_err(|e| node.redis_error("", e))?;
    let mut replies = replies.into_iter();
    let value = text_of(replies.next());
    let pttl: i64 = read(replies.next()).unwrap_or(-1);
    let fence: Option<String> = read(replies.next());
    let queue = read(replies.next()).unwrap_or_default();
    let places = replies.next().and_then(Result::ok).map(scored);
    let now_ms = read::<(u64, u64)>(replies.next()).map(|(s, us)| s * 1000 + us / 1000);
    // Only the live shared holders (a holder's place ends with its lease), by fence.
    let mut readers: Vec<(String, Option<u64>)> = places
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, expires)| now_ms.is_none_or(|now| expires.is_none_or(|e| e > now)))
        .map(|(place, _)| match place.split_once(' ') {
            Some((value, fence)) => (value.to_owned(), fence.parse().ok()),
            None => (place, None),
        })
        .collect();
    readers.sort_by_key(|(_, fence)| *fence);
    let permits = value.as_deref().and_then(crate::model::keys::permits_of);
    let held = match permits {
        Some(n) => held_permits(node, keys, n).await?,
        None => Vec::new(),
    };
    Ok(View {
        key: value.map(|v| (v, pttl)),
        fence: fence.and_then(|f| f.parse().ok()),
        queue,
        permits,
        readers,
        held,
    })
}

/// The members and scores of a `ZRANGE .. WITHSCORES` reply: pairs (RESP3), or members and
/// scores in turn (RESP2); a score that is not a whole number reads as none.
fn scored(reply: Value) -> Vec<(String, Option<u64>)> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    let flat: Vec<Value> = items
        .into_iter()
        .flat_map(|item| match item {
            Value::Array(pair) => pair,
            other => vec![other],
        })
        .collect();
    flat.chunks_exact(2)
        .filter_map(|pair| {
            let member = text_of(Some(Ok(pair[0].clone())))?;
            let score = match &pair[1] {
                Value::Double(d) => Some(*d),
                other => text_of(Some(Ok(other.clone()))).and_then(|s| s.parse().ok()),
            };
            let whole = score
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| s as u64);
            Some((member, whole))
        })
        .collect()
}

/// The permits of the lock `keys` that are held, of its `permits`, with their values and
/// `PTTL`s (one pipeline: the permits share the lock's slot).
async fn held_permits(
    node: &Node,
    keys: &Keys,
    permits: u32,
) -> Result<Vec<(u32, String, i64)>, LockError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for i in 0..permits {
        let permit = keys.permit(i, permits);
        pipe.cmd("GET")
            .arg(&permit.key)
            .cmd("PTTL")
            .arg(&permit.key);
    }
    let replies: Vec<redis::RedisResult<Value>> = node
        .query_pipeline(&pipe)
        .await
        .map_err(|e| node.redis_error("", e))?;
    let mut replies = replies.into_iter();
    let mut held = Vec::new();
    for i in 0..permits {
        let (value, pttl) = (text_of(replies.next()), read(replies.next()));
        if let Some(value) = value {
            held.push((i, value, pttl.unwrap_or(-1)));
        }
    }
    Ok(held)
}

impl Locker {
    /// Who holds the lock `name` now: its holders (host, process id, label; each shared holder
    /// with its fence, each held permit), the last fence recorded, the time left on its key, and
    /// its waiters in order; `None` when it is free (a lock with permits: when none is held).
    /// On Redlock, the value a majority of nodes hold (with the least time left among them).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locker = lock_runtime::Locker::connect("redis://127.0.0.1:6379").await?;
    /// match locker.inspect("invoice:42").await? {
    ///     None => println!("free"),
    ///     Some(info) => {
    ///         for holding in &info.holders {
    ///             // `holder` is `None` for a value another client wrote.
    ///             if let Some(who) = &holding.holder {
    ///                 println!("held by pid {} on {} since {:?}", who.pid, who.host, who.since);
    ///             }
    ///         }
    ///         println!("{} waiting, key expires in {:?}", info.waiters.len(), info.ttl_left);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>, LockError> {
        if let Some(here) = self.engine_here() {
            return Box::pin(here.inspect(name)).await;
        }
        let key = self.key_of(name);
        let deployment = &self.acquirer().deployment;
        let keys = deployment.keys(key.clone());
        let views = crate::plumbing::fanout::join_all_values(
            deployment.nodes().iter().map(|n| view(n, &keys)),
        )
        .await;
        // Each value of the key: on how many nodes, the least time left, the first view.
        let mut held: HashMap<String, (usize, i64, usize)> = HashMap::new();
        let mut fence: Option<u64> = None;
        let mut answered = Vec::new();
        let mut last_error = None;
        for v in views {
            match v {
                Ok(v) => {
                    fence = fence.max(v.fence);
                    if let Some((value, pttl)) = &v.key {
                        let entry =
                            held.entry(value.clone())
                                .or_insert((0, i64::MAX, answered.len()));
                        entry.0 += 1;
                        entry.1 = entry.1.min(*pttl);
                    }
                    answered.push(v);
                }
                Err(e) => last_error = Some(e),
            }
        }
        if answered.len() < deployment.needed() {
            return Err(last_error.map_or_else(
                || LockError::config(name, "no node answered"),
                |e| e.for_lock(name),
            ));
        }
        let best = held.into_iter().max_by_key(|(_, (count, _, _))| *count);
        let best = best.filter(|(_, (count, _, _))| *count >= deployment.needed());
        // Permits live on one logical server only (see `LockOptions::with_permits`).
        let alone = deployment.nodes().len() == 1;
        let mut answered: Vec<Option<View>> = answered.into_iter().map(Some).collect();
        Ok(match best {
            Some((value, _)) if alone && crate::model::keys::permits_of(&value).is_some() => {
                answered
                    .pop()
                    .flatten()
                    .and_then(|view| LockInfo::of_permits(name, &key, view))
            }
            Some((value, (_, pttl, at))) => {
                let view = View {
                    fence,
                    ..answered[at].take().unwrap_or_default()
                };
                Some(LockInfo::of_key(name, &key, value, pttl, view))
            }
            None if alone => answered
                .pop()
                .flatten()
                .and_then(|view| LockInfo::of_permits(name, &key, view)),
            None => None,
        })
    }

    /// The locks whose names match `pattern` (a Redis glob: `*`, `?`, `[..]`) held now, at most
    /// [`LIST_LIMIT`], sorted by name; a lock with permits once, under its name. Keys are found
    /// with `SCAN` on every primary (no `KEYS`), then each is inspected.
    pub async fn list(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        if let Some(here) = self.engine_here() {
            return Box::pin(here.list(pattern)).await;
        }
        let format = self.key_format();
        let globs = [
            format.glob(self.prefix(), pattern),
            format.permit_glob(self.prefix(), pattern),
        ];
        let deployment = Arc::clone(&self.acquirer().deployment);
        let mut names = BTreeSet::new();
        for node in deployment.nodes() {
            for (i, glob) in globs.iter().enumerate() {
                // The lock keys, then the keys of permits; other keys of a lock name no lock.
                let found = node
                    .scan(glob, LIST_LIMIT, |k| match i {
                        0 => self.name_of(k),
                        _ => format.name_of_permit(self.prefix(), k),
                    })
                    .await
                    .map_err(|e| node.redis_error("", e))?;
                names.extend(found);
            }
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
    /// waiters are woken (the first in line gets it). For a lock with permits, `value` is a
    /// permit holder's ([`Holding::value`]): the permit that holds it is freed. For a shared
    /// hold, `value` is one shared holder's: that holder leaves the shared holders (the others
    /// keep the lock, and the last one out releases it); the key's own value (`shared:..`)
    /// releases the whole shared hold. `Ok(false)` when
    /// the value changed meanwhile (nothing was touched). The holder, if alive, learns at its
    /// next renewal that it lost the lock, and its body is cancelled.
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_runtime::Locker) -> Result<(), lock_runtime::LockError> {
    /// // The holder's machine is gone for good: free the lock, unless it changed hands since.
    /// if let Some(info) = locker.inspect("nightly").await? {
    ///     if locker.force_release("nightly", &info.value).await? {
    ///         println!("released; the first waiter gets it");
    ///     } else {
    ///         println!("held by someone else by now; nothing was touched");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self, name: &str, value: &str) -> Result<bool, LockError> {
        if let Some(here) = self.engine_here() {
            return Box::pin(here.force_release(name, value)).await;
        }
        let deployment = &self.acquirer().deployment;
        let keys = deployment.keys(self.key_of(name));
        if deployment.force_release_permit(name, &keys, value).await?
            || deployment.force_release_shared(name, &keys, value).await?
        {
            return Ok(true);
        }
        deployment.force_release(name, &keys, value).await
    }

    /// The lock name of a key of this locker, `None` for its other keys (fence, queue).
    fn name_of(&self, key: &str) -> Option<String> {
        self.key_format().name_of(self.prefix(), key)
    }
}
