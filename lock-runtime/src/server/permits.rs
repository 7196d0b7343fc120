//! A lock with `permits = N` on one server: taking the first free of its N permit keys, and
//! freeing the one an attempt dropped mid-request may have taken. Holding, renewing and releasing
//! a permit is holding, renewing and releasing a lock key.

use std::time::Duration;

use redis::{RedisResult, Value};
use tokio::time::Instant;

use super::Node;
use super::acquire::{AcquireRequest, value_text};
use crate::model::keys::{Keys, permits_of};
use crate::server::scripts::{self, evalsha};

/// The reply to an attempt on a lock with `permits = N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PermitReply {
    /// Permit `permit` was taken, with this fence.
    Taken { fence: u64, permit: u32 },
    /// Every permit is held; the soonest expiry among them, when one has an expiry.
    Busy { pttl: Option<Duration> },
    /// A permit is free, but waiters queued before this caller come first: the first of them
    /// and its state.
    NotOurTurn { head: String, state: String },
    /// Held in another mode, or with another N: the lock's key holds `held`.
    OtherMode { held: String },
    /// The count or the fence counter holds data that is not ours; nothing was changed.
    Foreign { key: String, detail: String },
    /// Taken, but fewer replicas than asked acknowledged it in time; it was freed again.
    NotReplicated { acked: usize },
}

impl Node {
    /// One attempt on the lock `keys` with `permits` permits (see [`scripts::ACQUIRE_PERMIT`]).
    pub(crate) async fn acquire_permit(
        &self,
        keys: &Keys,
        permits: u32,
        req: &AcquireRequest<'_>,
    ) -> RedisResult<PermitReply> {
        let slots = permit_keys(keys, permits);
        let numkeys = 4 + slots.len();
        let bytes = numkeys * (keys.key.len() + 20) + 200;
        let mut cmd = evalsha(&scripts::ACQUIRE_PERMIT, numkeys, numkeys + 10, bytes);
        cmd.arg(&keys.key)
            .arg(keys.fence())
            .arg(keys.queue())
            .arg(keys.queue_states());
        for slot in &slots {
            cmd.arg(&slot.key);
        }
        req.push_args(&mut cmd);
        cmd.arg(permits);
        req.push_waiter(&mut cmd, true);
        let sent = Instant::now();
        let wait = self.wait_cmd(req.ttl_ms);
        let (reply, acked): (Vec<Value>, _) = self
            .eval(&scripts::ACQUIRE_PERMIT, &cmd, wait.as_ref(), req.limit)
            .await?;
        self.rtt.record(sent.elapsed());
        let int = |i: usize| match reply.get(i) {
            Some(Value::Int(n)) => *n,
            _ => -1,
        };
        let text = |i: usize| reply.get(i).map(value_text).unwrap_or_default();
        Ok(match int(0) {
            1 => {
                let permit = int(2).max(0) as u32;
                match acked {
                    Some(acked) if acked < self.replicas => {
                        let slot = &slots[permit as usize];
                        if let Err(e) = self.release(slot, req.token, &self.undo()).await {
                            tracing::debug!(target: "lock_runtime::acquire", node = %self.addr, key = %slot.key, error = %e, "freeing an unacknowledged permit failed; it expires by its ttl");
                        }
                        PermitReply::NotReplicated { acked }
                    }
                    _ => PermitReply::Taken {
                        fence: int(1).max(0) as u64,
                        permit,
                    },
                }
            }
            0 => PermitReply::Busy {
                pttl: u64::try_from(int(1)).ok().map(Duration::from_millis),
            },
            2 => PermitReply::NotOurTurn {
                head: text(1),
                state: text(2),
            },
            -3 => PermitReply::OtherMode { held: text(1) },
            -1 => PermitReply::Foreign {
                key: reply.get(2).map_or_else(|| keys.key.clone(), value_text),
                detail: format!("holds a {} value, not a lock", text(1)),
            },
            _ => PermitReply::Foreign {
                key: keys.fence().to_string(),
                detail: text(1),
            },
        })
    }

    /// N, while permits of the lock `keys` are held (its key holds `permits:<N>`); `None`
    /// otherwise (or when the key holds another type).
    pub(crate) async fn permit_count(&self, keys: &Keys) -> RedisResult<Option<u32>> {
        let mut pipe = redis::pipe();
        // A key of another type reads as no count, not as an error.
        pipe.ignore_errors().cmd("GET").arg(&keys.key);
        let replies: Vec<RedisResult<Option<String>>> = self.query_pipeline(&pipe).await?;
        let held = replies.into_iter().next().and_then(Result::ok).flatten();
        Ok(held.as_deref().and_then(permits_of))
    }

    /// Frees the permit that `token` holds, if any, and tells the waiters (see
    /// [`scripts::FORGET_PERMIT`]); true when a permit held it.
    pub(crate) async fn forget_permit(
        &self,
        keys: &Keys,
        permits: u32,
        token: &str,
    ) -> RedisResult<bool> {
        let slots = permit_keys(keys, permits);
        let publish = self.publish_command();
        let bytes = (slots.len() + 1) * (keys.key.len() + 20) + token.len() + 80;
        let numkeys = slots.len() + 1;
        let mut cmd = evalsha(&scripts::FORGET_PERMIT, numkeys, numkeys + 3, bytes);
        cmd.arg(&keys.key);
        for slot in &slots {
            cmd.arg(&slot.key);
        }
        cmd.arg(token).arg(keys.channel()).arg(publish);
        let limit = self.settings.response_timeout;
        let (freed, _): (Value, _) = self
            .eval(&scripts::FORGET_PERMIT, &cmd, None, limit)
            .await?;
        Ok(freed == Value::Int(1))
    }
}

/// The keys of permits 0 to `permits - 1` of the lock `keys`.
fn permit_keys(keys: &Keys, permits: u32) -> Vec<Keys> {
    (0..permits).map(|i| keys.permit(i, permits)).collect()
}
