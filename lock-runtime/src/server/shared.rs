//! A shared hold of a read-write lock on one server: joining the shared holders (see
//! [`scripts::ACQUIRE_SHARED`]) and leaving them (see [`scripts::RELEASE_SHARED`]).

use redis::{RedisResult, Value};
use tokio::time::Instant;

use super::acquire::{AcquireReply, AcquireRequest};
use super::{Node, Release};

/// Where a shared holder holds: the lock key's value, which every shared holder renews, and its
/// own member in the set of holders (`<token> <fence>`, scored by its expiry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedPlace {
    pub value: String,
    pub member: String,
}
use crate::model::keys::Keys;
use crate::server::scripts::{self, evalsha};

impl Node {
    /// One shared attempt on the lock `keys`; with `Taken`, the place it took: the value the
    /// lock's key holds (the holder's token for renewals) and its member in the holders' set.
    pub(crate) async fn acquire_shared(
        &self,
        keys: &Keys,
        req: &AcquireRequest<'_>,
    ) -> RedisResult<(AcquireReply, Option<SharedPlace>)> {
        let script = &scripts::ACQUIRE_SHARED;
        let mut cmd = evalsha(script, 5, 14, 5 * keys.key.len() + 260);
        cmd.arg(&keys.key)
            .arg(keys.fence())
            .arg(keys.queue())
            .arg(keys.queue_states())
            .arg(keys.readers());
        req.push_args(&mut cmd);
        cmd.arg(self.publish_command());
        req.push_waiter(&mut cmd, false);
        let sent = Instant::now();
        let wait = self.wait_cmd(req.ttl_ms);
        let (reply, acked): (Vec<Value>, _) =
            self.eval(script, &cmd, wait.as_ref(), req.limit).await?;
        self.rtt.record(sent.elapsed());
        let read = AcquireReply::read(keys, &reply);
        let AcquireReply::Taken { .. } = read else {
            return Ok((read, None));
        };
        let text = |i: usize| reply.get(i).map(super::acquire::value_text);
        let place = text(2)
            .zip(text(3))
            .map(|(value, member)| SharedPlace { value, member });
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
        let token = place;
        let script = &scripts::RELEASE_SHARED;
        let key = keys.key.as_ref();
        let mut cmd = evalsha(
            script,
            4,
            9,
            4 * key.len() + value.len() + token.len() + 120,
        );
        cmd.arg(key)
            .arg(keys.readers())
            .arg(keys.queue())
            .arg(keys.fence());
        cmd.arg(value)
            .arg(token)
            .arg(how.fence_retention_ms)
            .arg(self.publish_command())
            .arg(how.keep_ms);
        let limit = self.settings.response_timeout;
        let (done, _): (Value, _) = self.eval(script, &cmd, None, limit).await?;
        Ok(self.released(keys, &done, how))
    }
}
