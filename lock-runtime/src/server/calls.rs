//! The parameters of each script: one type per script, whose fields name what the script gets,
//! and one encoder ([`Call::command`]) that writes its KEYS and ARGV in the order the script
//! reads them into named locals (see the top of each `lua/*.lua`). Every name and marker comes
//! from `model::keys`: the scripts spell none.

use redis::{Cmd, Script};

use super::Release as How;
use super::acquire::AcquireRequest;
use super::scripts::{self, evalsha};
use crate::model::keys::{
    GRANTS_MARK, HANDED_MARK, KEPT_MARK, Keys, MARKED, PERMITS_MARK, SHARED_MARK, UNMARKED,
    permits_mark,
};

/// One script call: its script, its keys and arguments.
pub(crate) trait Call {
    /// The script called.
    fn script(&self) -> &'static Script;
    /// How many of the written arguments are KEYS.
    fn numkeys(&self) -> usize;
    /// About how many arguments, and how many bytes, [`Call::write`] writes (a buffer size).
    fn size(&self) -> (usize, usize);
    /// Writes the KEYS, then the ARGV.
    fn write(&self, cmd: &mut Cmd);

    /// The `EVALSHA` of this call.
    fn command(&self) -> Cmd {
        let (args, bytes) = self.size();
        let mut cmd = evalsha(self.script(), self.numkeys(), args, bytes);
        self.write(&mut cmd);
        cmd
    }
}

/// A bool as the scripts read a flag.
fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

impl AcquireRequest<'_> {
    /// The first four arguments of the acquire scripts: token, ttl, fence quantum and retention.
    fn write_lease(&self, cmd: &mut Cmd) {
        cmd.arg(self.token)
            .arg(self.ttl_ms)
            .arg(self.fence_quantum)
            .arg(self.fence_retention_ms);
    }

    /// A waiter's id, grace, the stale head to evict and the state it was seen with (empty, and
    /// a grace of 0, for a caller that does not wait: only a waiter evicts).
    fn write_waiter(&self, cmd: &mut Cmd) {
        let Some(waiter) = self.waiter else {
            cmd.arg("").arg(0).arg("").arg("");
            return;
        };
        let (evict, seen) = self.evict.unwrap_or(("", ""));
        cmd.arg(&waiter.id)
            .arg(waiter.grace.as_millis() as u64)
            .arg(evict)
            .arg(seen);
    }

    /// The token of this waiter's previous attempt (empty: none).
    fn previous(&self) -> &str {
        self.waiter.map_or("", |w| w.previous.as_str())
    }
}

/// `ACQUIRE`: one attempt on a lock's key, by a waiter or on a Redlock node.
pub(crate) struct Acquire<'a> {
    /// The lock's names.
    pub keys: &'a Keys,
    /// The attempt.
    pub req: &'a AcquireRequest<'a>,
}

impl Call for Acquire<'_> {
    fn script(&self) -> &'static Script {
        &scripts::ACQUIRE
    }
    fn numkeys(&self) -> usize {
        4
    }
    fn size(&self) -> (usize, usize) {
        (17, 4 * self.keys.key.len() + 3 * self.req.token.len() + 120)
    }
    fn write(&self, cmd: &mut Cmd) {
        let keys = self.keys;
        cmd.arg(&keys.key)
            .arg(keys.fence())
            .arg(keys.queue())
            .arg(keys.queue_states());
        self.req.write_lease(cmd);
        self.req.write_waiter(cmd);
        cmd.arg(self.req.previous())
            .arg(UNMARKED)
            .arg(MARKED)
            .arg(HANDED_MARK)
            .arg(PERMITS_MARK);
    }
}

/// `ACQUIRE_UNQUEUED`: one attempt on a server that keeps no waiter queue (a Redlock node).
pub(crate) struct AcquireUnqueued<'a> {
    /// The lock's names.
    pub keys: &'a Keys,
    /// The attempt.
    pub req: &'a AcquireRequest<'a>,
}

impl Call for AcquireUnqueued<'_> {
    fn script(&self) -> &'static Script {
        &scripts::ACQUIRE_UNQUEUED
    }
    fn numkeys(&self) -> usize {
        2
    }
    fn size(&self) -> (usize, usize) {
        (7, 2 * self.keys.key.len() + self.req.token.len() + 60)
    }
    fn write(&self, cmd: &mut Cmd) {
        cmd.arg(&self.keys.key).arg(self.keys.fence());
        self.req.write_lease(cmd);
        cmd.arg(PERMITS_MARK);
    }
}

/// `ACQUIRE_SHARED`: one attempt at a shared hold.
pub(crate) struct AcquireShared<'a> {
    /// The lock's names.
    pub keys: &'a Keys,
    /// The attempt.
    pub req: &'a AcquireRequest<'a>,
    /// `PUBLISH`, or `SPUBLISH` on Redis Cluster.
    pub publish: &'a str,
}

impl Call for AcquireShared<'_> {
    fn script(&self) -> &'static Script {
        &scripts::ACQUIRE_SHARED
    }
    fn numkeys(&self) -> usize {
        5
    }
    fn size(&self) -> (usize, usize) {
        (20, 6 * self.keys.key.len() + 2 * self.req.token.len() + 160)
    }
    fn write(&self, cmd: &mut Cmd) {
        let keys = self.keys;
        cmd.arg(&keys.key)
            .arg(keys.fence())
            .arg(keys.queue())
            .arg(keys.queue_states())
            .arg(keys.readers());
        self.req.write_lease(cmd);
        cmd.arg(self.publish).arg(keys.channel());
        self.req.write_waiter(cmd);
        cmd.arg(HANDED_MARK)
            .arg(UNMARKED)
            .arg(MARKED)
            .arg(SHARED_MARK)
            .arg(PERMITS_MARK);
    }
}

/// `ACQUIRE_PERMIT`: one attempt on a lock with `permits = N`.
pub(crate) struct AcquirePermit<'a> {
    /// The lock's names.
    pub keys: &'a Keys,
    /// The keys of permits 0 to N - 1.
    pub permits: &'a [Keys],
    /// The attempt.
    pub req: &'a AcquireRequest<'a>,
}

impl Call for AcquirePermit<'_> {
    fn script(&self) -> &'static Script {
        &scripts::ACQUIRE_PERMIT
    }
    fn numkeys(&self) -> usize {
        4 + self.permits.len()
    }
    fn size(&self) -> (usize, usize) {
        let n = self.numkeys();
        (
            n + 13,
            n * (self.keys.key.len() + 20) + 3 * self.req.token.len() + 120,
        )
    }
    fn write(&self, cmd: &mut Cmd) {
        let keys = self.keys;
        cmd.arg(&keys.key)
            .arg(keys.fence())
            .arg(keys.queue())
            .arg(keys.queue_states());
        for permit in self.permits {
            cmd.arg(&permit.key);
        }
        self.req.write_lease(cmd);
        cmd.arg(permits_mark(self.permits.len() as u32));
        self.req.write_waiter(cmd);
        cmd.arg(self.req.previous())
            .arg(HANDED_MARK)
            .arg(UNMARKED)
            .arg(MARKED);
    }
}

/// `FORGET_PERMIT`: frees the permit an attempt of unknown outcome may hold.
pub(crate) struct ForgetPermit<'a> {
    /// The lock's names.
    pub keys: &'a Keys,
    /// The keys of permits 0 to N - 1.
    pub permits: &'a [Keys],
    /// The attempt's token.
    pub token: &'a str,
    /// `PUBLISH`, or `SPUBLISH` on Redis Cluster.
    pub publish: &'a str,
}

impl Call for ForgetPermit<'_> {
    fn script(&self) -> &'static Script {
        &scripts::FORGET_PERMIT
    }
    fn numkeys(&self) -> usize {
        1 + self.permits.len()
    }
    fn size(&self) -> (usize, usize) {
        let n = self.numkeys();
        (
            n + 6,
            (n + 1) * (self.keys.key.len() + 20) + self.token.len() + 80,
        )
    }
    fn write(&self, cmd: &mut Cmd) {
        cmd.arg(&self.keys.key);
        for permit in self.permits {
            cmd.arg(&permit.key);
        }
        cmd.arg(self.token)
            .arg(self.keys.channel())
            .arg(self.publish)
            .arg(UNMARKED)
            .arg(MARKED)
            .arg(PERMITS_MARK);
    }
}

/// `RELEASE`: the release of a lock's key (or of a permit's key).
pub(crate) struct Release<'a, K: AsRef<str>> {
    /// The names of the lease's key.
    pub keys: &'a Keys<K>,
    /// The lease's token.
    pub token: &'a str,
    /// How it goes: kept, published, the fence to record.
    pub how: &'a How,
    /// `PUBLISH`, or `SPUBLISH` on Redis Cluster.
    pub publish: &'a str,
}

impl<K: AsRef<str>> Call for Release<'_, K> {
    fn script(&self) -> &'static Script {
        &scripts::RELEASE
    }
    fn numkeys(&self) -> usize {
        // A permit's key: its lock's key and every permit of the lock too.
        match self.keys.permits() {
            0 => 4,
            n => 5 + n as usize,
        }
    }
    fn size(&self) -> (usize, usize) {
        let n = self.numkeys();
        let key = self.keys.key.as_ref().len();
        (n + 16, (n + 2) * (key + 20) + 2 * self.token.len() + 120)
    }
    fn write(&self, cmd: &mut Cmd) {
        let (keys, how) = (self.keys, self.how);
        cmd.arg(keys.key.as_ref())
            .arg(keys.queue())
            .arg(keys.queue_states())
            .arg(keys.fence());
        if keys.permits() > 0 {
            cmd.arg(keys.lock_key());
            for permit in keys.sibling_permits() {
                cmd.arg(&permit.key);
            }
        }
        cmd.arg(self.token)
            .arg(how.fence_retention_ms)
            .arg(how.record_fence)
            .arg(self.publish)
            .arg(how.keep_ms)
            .arg(flag(how.always_publish))
            .arg(flag(how.look_at_queue))
            .arg(keys.channel())
            .arg(keys.grant_channels())
            .arg(GRANTS_MARK)
            .arg(HANDED_MARK)
            .arg(UNMARKED)
            .arg(MARKED)
            .arg(KEPT_MARK)
            .arg(PERMITS_MARK)
            .arg(keys.permit_index());
    }
}

/// `RELEASE_SHORT`: the common release, tried first by a lease taken by the plain commands.
pub(crate) struct ReleaseShort<'a, K: AsRef<str>> {
    /// The names of the lease's key.
    pub keys: &'a Keys<K>,
    /// The lease's token.
    pub token: &'a str,
    /// The fence to record and the counter's retention.
    pub how: &'a How,
}

impl<K: AsRef<str>> Call for ReleaseShort<'_, K> {
    fn script(&self) -> &'static Script {
        &scripts::RELEASE_SHORT
    }
    // Without a fence to record, the counter is neither touched nor sent: the key and the token.
    fn numkeys(&self) -> usize {
        if self.how.record_fence == 0 { 1 } else { 2 }
    }
    fn size(&self) -> (usize, usize) {
        let key = self.keys.key.as_ref().len();
        (5, 2 * key + self.token.len() + 60)
    }
    fn write(&self, cmd: &mut Cmd) {
        cmd.arg(self.keys.key.as_ref());
        if self.how.record_fence == 0 {
            cmd.arg(self.token);
            return;
        }
        cmd.arg(self.keys.fence())
            .arg(self.token)
            .arg(self.how.fence_retention_ms)
            .arg(self.how.record_fence);
    }
}

/// `RELEASE_SHARED`: one shared holder leaves.
pub(crate) struct ReleaseShared<'a, K: AsRef<str>> {
    /// The lock's names.
    pub keys: &'a Keys<K>,
    /// The lock key's value the holder renews (empty: whatever shared value it holds).
    pub value: &'a str,
    /// The holder's member in the holders' set, or only its token when that is not known.
    pub place: &'a str,
    /// How it goes: kept for `min_hold`, the counter's retention.
    pub how: &'a How,
    /// `PUBLISH`, or `SPUBLISH` on Redis Cluster.
    pub publish: &'a str,
}

impl<K: AsRef<str>> Call for ReleaseShared<'_, K> {
    fn script(&self) -> &'static Script {
        &scripts::RELEASE_SHARED
    }
    fn numkeys(&self) -> usize {
        5
    }
    fn size(&self) -> (usize, usize) {
        let key = self.keys.key.as_ref().len();
        (
            18,
            7 * (key + 20) + self.value.len() + self.place.len() + 120,
        )
    }
    fn write(&self, cmd: &mut Cmd) {
        let (keys, how) = (self.keys, self.how);
        cmd.arg(keys.key.as_ref())
            .arg(keys.readers())
            .arg(keys.queue())
            .arg(keys.queue_states())
            .arg(keys.fence());
        cmd.arg(self.value)
            .arg(self.place)
            .arg(how.fence_retention_ms)
            .arg(self.publish)
            .arg(how.keep_ms)
            .arg(keys.channel())
            .arg(keys.grant_channels())
            .arg(GRANTS_MARK)
            .arg(HANDED_MARK)
            .arg(UNMARKED)
            .arg(MARKED)
            .arg(KEPT_MARK)
            .arg(SHARED_MARK);
    }
}

/// The marks the renewal scripts read before the leases.
fn write_renew_marks(cmd: &mut Cmd) {
    cmd.arg(UNMARKED)
        .arg(MARKED)
        .arg(SHARED_MARK)
        .arg(PERMITS_MARK);
}

/// `RENEW`: many leases, `(key, token, ttl_ms)` each, their keys declared.
pub(crate) struct Renew<'a> {
    /// The leases.
    pub items: &'a [(&'a str, &'a str, u64)],
}

impl Call for Renew<'_> {
    fn script(&self) -> &'static Script {
        &scripts::RENEW
    }
    fn numkeys(&self) -> usize {
        self.items.len()
    }
    fn size(&self) -> (usize, usize) {
        let bytes = self.items.iter().map(|(k, t, _)| k.len() + t.len() + 40);
        (3 * self.items.len() + 4, bytes.sum::<usize>() + 40)
    }
    fn write(&self, cmd: &mut Cmd) {
        for (key, _, _) in self.items {
            cmd.arg(*key);
        }
        write_renew_marks(cmd);
        for (_, token, ttl_ms) in self.items {
            cmd.arg(*token).arg(*ttl_ms);
        }
    }
}

/// `RENEW_ANY_SLOT`: many leases on one Redis Cluster primary, their keys in the arguments.
pub(crate) struct RenewAnySlot<'a> {
    /// The leases.
    pub items: &'a [(&'a str, &'a str, u64)],
}

impl Call for RenewAnySlot<'_> {
    fn script(&self) -> &'static Script {
        &scripts::RENEW_ANY_SLOT
    }
    fn numkeys(&self) -> usize {
        0
    }
    fn size(&self) -> (usize, usize) {
        let bytes = self.items.iter().map(|(k, t, _)| k.len() + t.len() + 40);
        (3 * self.items.len() + 4, bytes.sum::<usize>() + 40)
    }
    fn write(&self, cmd: &mut Cmd) {
        write_renew_marks(cmd);
        for (key, token, ttl_ms) in self.items {
            cmd.arg(*key).arg(*token).arg(*ttl_ms);
        }
    }
}

/// `FENCE`: the fence of a lease taken without one.
pub(crate) struct Fence<'a> {
    /// The lock's names.
    pub keys: &'a Keys,
    /// The lease's token.
    pub token: &'a str,
    /// The counter's retention; 0: forever.
    pub retention_ms: u64,
}

impl Call for Fence<'_> {
    fn script(&self) -> &'static Script {
        &scripts::FENCE
    }
    fn numkeys(&self) -> usize {
        2
    }
    fn size(&self) -> (usize, usize) {
        (6, 2 * self.keys.key.len() + self.token.len() + 60)
    }
    fn write(&self, cmd: &mut Cmd) {
        cmd.arg(&self.keys.key)
            .arg(self.keys.fence())
            .arg(self.token)
            .arg(self.retention_ms)
            .arg(UNMARKED)
            .arg(MARKED);
    }
}

/// `RAISE_FENCE`: raises the counter to a fence (Redlock).
pub(crate) struct RaiseFence<'a> {
    /// The lock's names.
    pub keys: &'a Keys,
    /// The fence to raise the counter to.
    pub fence: u64,
    /// The counter's retention; 0: forever.
    pub retention_ms: u64,
}

impl Call for RaiseFence<'_> {
    fn script(&self) -> &'static Script {
        &scripts::RAISE_FENCE
    }
    fn numkeys(&self) -> usize {
        1
    }
    fn size(&self) -> (usize, usize) {
        (3, self.keys.key.len() + 60)
    }
    fn write(&self, cmd: &mut Cmd) {
        cmd.arg(self.keys.fence())
            .arg(self.fence)
            .arg(self.retention_ms);
    }
}
