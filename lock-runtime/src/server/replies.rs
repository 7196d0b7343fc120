//! The replies of the scripts: one type per reply shape, each decoded in one place (its
//! `FromRedisValue`), so that no reply code is read twice.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::FenceReply;
use super::SharedPlace;

/// The text of a reply item.
pub(crate) fn value_text(value: &Value) -> String {
    match value {
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::ServerError(e) => format!("{e:?}"),
        other => format!("{other:?}"),
    }
}

fn unexpected(what: &str, value: &Value) -> ParsingError {
    ParsingError::from(format!("unexpected {what} reply: {value:?}"))
}

/// The reply of the acquire scripts (`ACQUIRE`, `ACQUIRE_UNQUEUED`, `ACQUIRE_SHARED`,
/// `ACQUIRE_PERMIT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// `{1, fence}`; a shared hold's `{1, fence, value, member}`; a permit's `{1, fence, index}`.
    Taken {
        fence: u64,
        place: Option<SharedPlace>,
        permit: Option<u32>,
    },
    /// `{0, pttl}`: held by someone else; the remaining PTTL when it has one.
    Busy { pttl: Option<Duration> },
    /// `{2, head, state}`: free (or handed to another waiter), but that waiter is first in line.
    NotOurTurn { head: String, state: String },
    /// `{-1, type}`: the lock's key holds another type; `{-1, type, key}`: a derived key does.
    WrongType { found: String, key: Option<String> },
    /// `{-2, why}`: the fence counter cannot give a fence.
    Unusable { why: String },
    /// `{-3, value}`: the lock's key holds another mode's value.
    OtherMode { held: String },
}

impl FromRedisValue for Attempt {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(items) = &v else {
            return Err(unexpected("acquire", &v));
        };
        let int = |i: usize| match items.get(i) {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        };
        let text = |i: usize| items.get(i).map(value_text);
        Ok(match int(0) {
            Some(1) => Attempt::Taken {
                fence: int(1).ok_or_else(|| unexpected("acquire", &v))?.max(0) as u64,
                place: text(2)
                    .zip(text(3))
                    .map(|(value, member)| SharedPlace { value, member }),
                permit: int(2).map(|i| i.max(0) as u32),
            },
            Some(0) => Attempt::Busy {
                pttl: int(1)
                    .and_then(|ms| u64::try_from(ms).ok())
                    .map(Duration::from_millis),
            },
            Some(2) => Attempt::NotOurTurn {
                head: text(1).unwrap_or_default(),
                state: text(2).unwrap_or_default(),
            },
            Some(-1) => Attempt::WrongType {
                found: text(1).unwrap_or_default(),
                key: text(2),
            },
            Some(-2) => Attempt::Unusable {
                why: text(1).unwrap_or_default(),
            },
            Some(-3) => Attempt::OtherMode {
                held: text(1).unwrap_or_default(),
            },
            _ => return Err(unexpected("acquire", &v)),
        })
    }
}

/// The reply of the release scripts (`RELEASE`, `RELEASE_SHARED`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Released {
    /// 0: the key (or the set) no longer held this holder; nothing was touched.
    NotOurs,
    /// 1: released (deleted, or kept for `min_hold`).
    Ours,
    /// Released and handed to a waiter: the grant message (`~<waiter id> ..`).
    Handed(Vec<u8>),
}

impl FromRedisValue for Released {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(0) => Ok(Released::NotOurs),
            Value::Int(1) => Ok(Released::Ours),
            Value::BulkString(grant) => Ok(Released::Handed(grant)),
            other => Err(unexpected("release", &other)),
        }
    }
}

/// The reply of `RELEASE_SHORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShortRelease {
    /// 1: the key held the token unmarked, and was deleted.
    Released,
    /// 0: the key holds anything else, untouched: `RELEASE` decides.
    NotShort,
}

impl FromRedisValue for ShortRelease {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(1) => Ok(ShortRelease::Released),
            Value::Int(0) => Ok(ShortRelease::NotShort),
            other => Err(unexpected("short release", &other)),
        }
    }
}

/// One lease's outcome in a renewal (`RENEW`, `RENEW_ANY_SLOT`; the reply is one per lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// 1.
    Renewed,
    /// 0: the key no longer holds the token (or the set the member).
    NotOurs,
    /// 2: not served by this primary (a moved slot); to be sent again, routed by its key.
    Elsewhere,
}

impl FromRedisValue for Renewal {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(1) => Ok(Renewal::Renewed),
            Value::Int(0) => Ok(Renewal::NotOurs),
            Value::Int(2) => Ok(Renewal::Elsewhere),
            other => Err(unexpected("renewal", &other)),
        }
    }
}

/// The reply of `FORGET_PERMIT`: whether a permit held the token (1) or not (0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Forgot(pub bool);

impl FromRedisValue for Forgot {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(n @ (0 | 1)) => Ok(Forgot(n == 1)),
            other => Err(unexpected("forget", &other)),
        }
    }
}

/// The reply of `FENCE`: `{1, fence}`, `{0}` (not ours), `{-2, why}`.
impl FromRedisValue for FenceReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(1), Value::Int(fence)] => Ok(FenceReply::Fence(*fence as u64)),
                [Value::Int(0)] => Ok(FenceReply::NotOurs),
                [Value::Int(-2), why] => Ok(FenceReply::Unusable(value_text(why))),
                _ => Err(unexpected("fence", &Value::Array(items))),
            },
            other => Err(unexpected("fence", &other)),
        }
    }
}

/// The reply of `RAISE_FENCE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Raised {
    /// 1: the counter is at the fence or above.
    Raised,
    /// `{-2, why}`: the counter cannot be raised (left as it is).
    Unusable(String),
}

impl FromRedisValue for Raised {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(1) => Ok(Raised::Raised),
            Value::Array(items) => match items.as_slice() {
                [Value::Int(-2), why] => Ok(Raised::Unusable(value_text(why))),
                _ => Err(unexpected("raise", &Value::Array(items))),
            },
            other => Err(unexpected("raise", &other)),
        }
    }
}
