//! A lock with `permits = N` on one server: taking the first free of its N permit keys, and
//! freeing the one an attempt dropped mid-request may have taken. Holding, renewing and releasing
//! a permit is holding, renewing and releasing a lock key.

use std::time::Duration;

use redis::RedisResult;
use tokio::time::Instant;

use super::Node;
use super::acquire::AcquireRequest;
use super::calls::{self, Call};
use super::replies::{Attempt, Forgot};
use crate::model::keys::{Keys, permits_of};

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
    /// One attempt on the lock `keys` with `permits` permits (see [`super::scripts::ACQUIRE_PERMIT`]).
    pub(crate) async fn acquire_permit(
        &self,
        keys: &Keys,
        permits: u32,
        req: &AcquireRequest<'_>,
    ) -> RedisResult<PermitReply> {
        let slots = permit_keys(keys, permits);
        let call = calls::AcquirePermit {
            keys,
            permits: &slots,
            req,
        };
        let sent = Instant::now();
        let wait = self.wait_cmd(req.ttl_ms, req.limit);
        let (reply, acked): (Attempt, _) = self
            .eval(call.script(), &call.command(), wait.as_ref(), req.limit)
            .await?;
        self.rtt.record(sent.elapsed());
        Ok(match reply {
            Attempt::Taken { fence, permit, .. } => {
                let permit = permit.unwrap_or(0);
                match acked {
                    Some(acked) if acked < self.replicas => {
                        let slot = &slots[permit as usize];
                        if let Err(e) = self.release(slot, req.token, &self.undo()).await {
                            tracing::debug!(target: "lock_runtime::acquire", node = %self.addr, key = %slot.key, error = %e, "freeing an unacknowledged permit failed; it expires by its ttl");
                        }
                        PermitReply::NotReplicated { acked }
                    }
                    _ => PermitReply::Taken { fence, permit },
                }
            }
            Attempt::Busy { pttl } => PermitReply::Busy { pttl },
            Attempt::NotOurTurn { head, state } => PermitReply::NotOurTurn { head, state },
            Attempt::OtherMode { held } => PermitReply::OtherMode { held },
            Attempt::WrongType { found, key } => PermitReply::Foreign {
                key: key.unwrap_or_else(|| keys.key.clone()),
                detail: format!("holds a {found} value, not a lock"),
            },
            Attempt::Unusable { why } => PermitReply::Foreign {
                key: keys.fence().to_string(),
                detail: why,
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
    /// [`super::scripts::FORGET_PERMIT`]); true when a permit held it.
    pub(crate) async fn forget_permit(
        &self,
        keys: &Keys,
        permits: u32,
        token: &str,
    ) -> RedisResult<bool> {
        let slots = permit_keys(keys, permits);
        let call = calls::ForgetPermit {
            keys,
            permits: &slots,
            token,
            publish: self.publish_command(),
        };
        let limit = self.settings.response_timeout;
        let (Forgot(freed), _) = self
            .eval(call.script(), &call.command(), None, limit)
            .await?;
        Ok(freed)
    }
}

/// The keys of permits 0 to `permits - 1` of the lock `keys`.
fn permit_keys(keys: &Keys, permits: u32) -> Vec<Keys> {
    (0..permits).map(|i| keys.permit(i, permits)).collect()
}
