//! A shared hold of a read-write lock on one server: joining the shared holders (see
//! [`super::scripts::ACQUIRE_SHARED`]) and leaving them (see [`super::scripts::RELEASE_SHARED`]).

use redis::RedisResult;
use tokio::time::Instant;

use super::acquire::{AcquireReply, AcquireRequest};
use super::calls::{self, Call};
use super::replies::Attempt;
use super::{Node, Release};

/// Where a shared holder holds: the lock key's value, which every shared holder renews, and its
/// own member in the set of holders (`<token> <fence>`, scored by its expiry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedPlace {
    pub value: String,
    pub member: String,
}
use crate::model::keys::Keys;

impl Node {
    /// One shared attempt on the lock `keys`; with `Taken`, the place it took: the value the
    /// lock's key holds (the holder's token for renewals) and its member in the holders' set.
    pub(crate) async fn acquire_shared(
        &self,
        keys: &Keys,
        req: &AcquireRequest<'_>,
    ) -> RedisResult<(AcquireReply, Option<SharedPlace>)> {
        let call = calls::AcquireShared {
            keys,
            req,
            publish: self.publish_command(),
        };
        let sent = Instant::now();
        let wait = self.wait_cmd(req.ttl_ms, req.limit);
        let (reply, acked): (Attempt, _) = self
            .eval(call.script(), &call.command(), wait.as_ref(), req.limit)
            .await?;
        self.rtt.record(sent.elapsed());
        let place = match &reply {
            Attempt::Taken { place, .. } => place.clone(),
            _ => return Ok((AcquireReply::of(keys, reply), None)),
        };
        let read = AcquireReply::of(keys, reply);
        match acked {
            Some(acked) if acked < self.replicas => {
                // Not acknowledged: leaves the holders again (a failover could lose the hold).
                let how = self.undo();
                if let Err(e) = self.release_shared(keys, "", req.token, &how).await {
                    tracing::debug!(target: "lock_runtime::acquire", node = %self.addr, key = %keys.key, error = %e, "leaving an unacknowledged shared hold failed; it expires by its lease");
                }
                Ok((AcquireReply::NotReplicated { acked }, None))
            }
            _ => Ok((read, place)),
        }
    }

    /// Takes a holder out of the shared holders of `keys` (whose key holds `value`; empty: any
    /// shared value), releasing the key when it was the last live one; true when it was one of
    /// them. `place`: its member in the set, or only its token when that is not known.
    pub(crate) async fn release_shared(
        &self,
        keys: &Keys<impl AsRef<str>>,
        value: &str,
        place: &str,
        how: &Release,
    ) -> RedisResult<bool> {
        let call = calls::ReleaseShared {
            keys,
            value,
            place,
            how,
            publish: self.publish_command(),
        };
        let limit = self.settings.response_timeout;
        let (done, _) = self
            .eval(call.script(), &call.command(), None, limit)
            .await?;
        Ok(self.released(keys, done, how))
    }
}
