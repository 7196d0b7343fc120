//! A lock with `permits = N` on one server: taking the first free of its N permit keys, and
//! freeing the one an attempt dropped mid-request may have taken. Holding, renewing and releasing
//! a permit is holding, renewing and releasing a lock key.

use std::time::Duration;

use redis::{RedisResult, Value};
use tokio::time::Instant;

use super::acquire::{AcquireRequest, value_text};
use super::{Node, Release};
use crate::model::keys::Keys;
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
    /// The name's holders use `permits = agreed`.
    Disagree { agreed: String },
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
        cmd.arg(keys.permit_count())
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
                        if let Err(e) = self.release(slot, req.token, &Release::UNDO).await {
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
            -3 => PermitReply::Disagree { agreed: text(1) },
            -1 => PermitReply::Foreign {
                key: keys.permit_count().to_string(),
                detail: format!("holds a {} value, not a count of permits", text(1)),
            },
            _ => PermitReply::Foreign {
                key: keys.fence().to_string(),
                detail: text(1),
            },
        })
    }

    /// The number of permits the holders of the lock `keys` agree on; `None` when none is
    /// kept (or the key holds something else than a count).
    pub(crate) async fn permit_count(&self, keys: &Keys) -> RedisResult<Option<u32>> {
        let mut pipe = redis::pipe();
        // A key of another type reads as no count, not as an error.
        pipe.ignore_errors().cmd("GET").arg(keys.permit_count());
        let replies: Vec<RedisResult<Option<String>>> = self.query_pipeline(&pipe).await?;
        let count = replies.into_iter().next().and_then(Result::ok).flatten();
        Ok(count.and_then(|n| parse_count(&n)))
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
        let bytes = slots.len() * (keys.key.len() + 20) + token.len() + 80;
        let mut cmd = evalsha(&scripts::FORGET_PERMIT, slots.len(), slots.len() + 3, bytes);
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

/// A count of permits as kept at `Keys::permit_count`: a number from 1 to the most allowed.
pub(crate) fn parse_count(count: &str) -> Option<u32> {
    let n: u32 = count.parse().ok()?;
    (1..=lock_rules::MAX_PERMITS)
        .contains(&u64::from(n))
        .then_some(n)
}

/// The keys of permits 0 to `permits - 1` of the lock `keys`.
fn permit_keys(keys: &Keys, permits: u32) -> Vec<Keys> {
    (0..permits).map(|i| keys.permit(i)).collect()
}
