//! The Lua scripts, one `.lua` file each under `lua/`, with the shared functions of `lua/lib/`
//! before them. Each is sent as EVALSHA; on NOSCRIPT (a new or restarted server) the node loads
//! it once and sends it again (see `Node::eval`). Each script's parameters are one type of
//! `calls` (its KEYS and ARGV, in the order the script reads them into named locals), and its
//! reply is decoded by one type of `replies`. Every key, channel and marker a script uses comes
//! from `model::keys` through those parameters: the Lua spells no name.

use std::sync::LazyLock;

use redis::Script;

/// The default fence counter retention in ms (`DEFAULT_FENCE_RETENTION`, 7 days).
pub(crate) const DEFAULT_RETENTION_MS: u64 = 604_800_000;

/// The largest fence: the largest integer a Lua number (a double) holds exactly. A counter at or
/// above it gives no more fences (an error, never a smaller fence; see `lua/lib/counter.lua`).
pub(crate) const MAX_FENCE: u64 = (1 << 53) - 1;

/// `lua/lib/<name>.lua`.
macro_rules! lib {
    ($name:literal) => {
        include_str!(concat!("lua/lib/", $name, ".lua"))
    };
}

/// `lua/<name>.lua`.
macro_rules! lua {
    ($name:literal) => {
        include_str!(concat!("lua/", $name, ".lua"))
    };
}

/// Returns `{1, fence}` when taken; `{0, pttl}` when held by someone else; `{2, head, state}` when
/// the lock is free, or handed to another waiter, and that waiter is first in line; `{-1, type}`
/// when the key holds another type (`{-1, type, key}` when the queue or its states do and the
/// attempt meets them: their types are read only then, see `lua/lib/queue.lua`), `{-2,
/// why}` when the fence counter cannot give a fence (see `lua/lib/counter.lua`); `{-3, value}`
/// when permits hold the name (the key holds `permits:<N>`, see `ACQUIRE_PERMIT`): another
/// mode, refused rather than waited for.
///
/// This is the path of waiters and of Redlock; an uncontended caller on one server takes the
/// lock with plain commands (see `Node::acquire_fast`). Waiters queue in arrival order (a sorted
/// set scored by arrival number). A release grants a lock with waiters to the first of them (the
/// key's value becomes the token of that waiter's last attempt, see `RELEASE`), so that nobody
/// can cut in, not even with a plain `SET NX`; an attempt that finds the lock granted to its
/// previous token takes it over. A waiter that queues behind a holder marks the holder's value
/// (its last field `;w=0` becomes `;w=1`, in place: the key keeps its expiry), and a waiter
/// that takes the lock while others still queue writes its value marked: a release whose value
/// is not marked then frees the key without looking at the queue (see `RELEASE`). Values
/// without that field (another client's, for one) are never changed.
/// A waiter's state in the hash is `"<nonce> <ttl ms> <grace ms>"`,
/// re-written at every attempt (the nonce is the attempt's token). No server clock decides who
/// is alive: a caller that saw the same head with the same state for longer than that head's
/// grace (measured on its own monotonic clock) sends it back here to be evicted, and it is
/// evicted (with any hand-over to it) only if its state has not changed since. The queue's keys
/// also expire 2 to 4 graces after the last waiter's attempt, for when everyone left (an attempt
/// extends them to 4 graces once less than 2 are left, so that most attempts need no `PEXPIRE`).
///
/// Fences: `max(counter + 1, floor)`, with `floor` the server's clock in µs. A fence never
/// exceeds the clock at the moment it is handed out (fewer than one acquisition per µs), so even
/// a counter that came back older (a restart from an older snapshot, AOF `everysec` after a
/// crash, a promoted replica) resumes above every fence handed out before, as long as the clock
/// does not go back. On a Redlock node (quantum 1 s) the floor is the clock rounded down to the
/// second, so that the nodes of a majority agree (and no second round trip raises them), except in
/// the second of a restart or save (`LASTSAVE`), where the exact clock is used.
///
/// Parameters: [`super::calls::Acquire`]; reply: [`super::replies::Attempt`].
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        lib!("marks"),
        lib!("counter"),
        lib!("queue"),
        lua!("acquire")
    ))
});

/// An attempt on a server that keeps no waiter queue for the lock (a Redlock node: nobody queues
/// across several servers): `SET NX PX` first, and the fence (as `ACQUIRE` computes it) only
/// once the key is taken. Replies as `ACQUIRE` does for a caller that does not wait: `{1, fence}`,
/// `{0, pttl}`, `{-1, type}` (the key holds another type), `{-2, error}` (the counter is not a
/// counter; the key just taken is deleted again), `{-3, value}` (permits hold the name). It
/// skips `ACQUIRE`'s look at the queue, its `GET` of the key and its hand-over checks, which
/// cost a Redlock node about an eighth of the script's time. A caller that cannot read the fence
/// sends plain commands instead (see `Node::acquire_unfenced`).
///
/// Parameters: [`super::calls::AcquireUnqueued`]; reply: [`super::replies::Attempt`].
pub(crate) static ACQUIRE_UNQUEUED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        lib!("marks"),
        lib!("counter"),
        lua!("acquire_unqueued")
    ))
});

/// The renewal of many leases in one call: lock keys (a lease's token), or sets of shared
/// holders (a holder's member), each for its own ttl.
/// Returns one integer per key: 1 when renewed, 0 when the key no longer holds the token (as
/// written, or with the waiters' mark set: see `ACQUIRE`), or the set no longer holds the
/// member (see `lua/lib/renew_one.lua`).
///
/// Parameters: [`super::calls::Renew`]; reply: one [`super::replies::Renewal`] per lease.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_CODE));

/// The text of [`RENEW`], for a `SCRIPT LOAD` sent ahead of the first renewal.
pub(crate) const RENEW_CODE: &str = concat!(lib!("marks"), lib!("renew_one"), lua!("renew"));

/// Compare-and-delete, keep for `min_hold`, or hand over to the first waiter. Its keys are the
/// lock's key, its waiter queue and states and its fence counter (declared: on Redis Cluster a
/// slot in migration then answers for all of them at once); a permit's key comes with its lock's
/// key and the keys of every permit of the lock (the last permit out frees the lock's key of its
/// N's mark; a permit whose N's mark is gone or another's is freed and reported not ours, as
/// another mode may have held the name beside it). The publish command is `PUBLISH`, or
/// `SPUBLISH` on Redis Cluster (sharded pub/sub: the message goes only to the primary of the
/// lock's slot, where its waiters listen).
/// Returns 1 when the key was ours, `~<waiter id> <token> <fence>` (a permit's key: with the
/// permit's index after it) when it was and was granted to that waiter (`~<waiter id>` when
/// handed over by id), 0 when it was not (then nothing is touched). Ours: the key holds the
/// token, or the token with the waiters' mark set.
///
/// - The short path: the key holds the token unmarked (no waiter queued behind this lease, see
///   `ACQUIRE`), with nothing to keep, publish or look at: the counter gets the fence when there
///   is one to record, then `DEL`, and nothing else, not even a look at the queue (the same for
///   a fenced lease as for one without). A caller that may have taken the key from under queued
///   waiters (an undo) asks for the look at the queue. A lease taken by the plain commands tries
///   [`RELEASE_SHORT`] first, which takes this path alone with at most two keys and three arguments.
/// - The fence counter gets the lease's fence here, for a lease taken by the plain-command path
///   (which does not write it): only while the key is still ours, so a lost lease never moves
///   the counter back.
/// - Kept for `min_hold`, the key gets a value that is no lease's token (the holder's value and
///   the kept mark), so that a renewal of the released lease still on its way cannot stretch it
///   back to the full ttl.
/// - With waiters queued, the lock is granted to the first live one, taken out of the queue: the
///   key's value becomes the token of that waiter's last attempt (marked when others still
///   queue), for that waiter's grace (its lease extends the key to the ttl half-way through
///   what is left of the grace; a vanished waiter holds up the lock no longer than it would
///   have kept its place), and its fence is computed here as the acquire script would
///   (`max(counter + 1, clock in µs)`, also written to the counter, kept for the locker's
///   retention). `~<waiter id> <token> <fence>` is published on the grant channel its id names
///   (`;grants=<id>` at its end: `<key>:released:<id>`, which only the waiters of its locker
///   listen to), else on `<key>:released`: that waiter holds the lock as soon as the message
///   reaches it, with no attempt of its own (one round trip less per hand-off), and the others
///   sleep on (any other message wakes every waiter). A waiter whose queue state has no ttl
///   (`<nonce> <grace ms>`: a shared caller, or one waiting for a permit) is handed the lock by
///   id instead, and leaves the queue (a second release meanwhile goes to the next in line): the
///   key holds `~<waiter id>` for its grace, taken by the waiter's next attempt. A counter that
///   is not a number is not touched (the DEL path: the waiter's attempt reports it). With nobody
///   queued nobody listens (a waiter queues before it waits), so nothing is published.
///
/// Parameters: [`super::calls::Release`]; reply: [`super::replies::Released`].
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        lib!("marks"),
        lib!("counter"),
        lib!("permits"),
        lib!("hand_over"),
        lua!("release")
    ))
});

/// The common release of a lease taken by the plain commands (no waiter had queued then): when
/// the lock's key holds the token as written (no waiter's mark), the counter gets the fence to
/// record (only ever raised, only on a counter), and the key is deleted. Its keys are the lock's
/// key and, with a fence to record, its fence counter (without one: the key and the token, no
/// more). Returns 1 when released, 0 when the key holds anything else: the
/// caller then sends [`RELEASE`], which decides every case (a waiter's mark: hand over; another
/// value: not ours). Two keys and three arguments: each argument a script is given costs the
/// server a string, and the common release is most of a lock's calls.
///
/// Parameters: [`super::calls::ReleaseShort`]; reply: [`super::replies::ShortRelease`].
pub(crate) static RELEASE_SHORT: LazyLock<Script> =
    LazyLock::new(|| Script::new(concat!(lib!("counter"), lua!("release_short"))));

/// A lock with `permits = N` is N lock keys: a holder takes a free one with `SET PX`, and holds,
/// renews and releases it as a lock's key (`RENEW`, `RELEASE`). One fence counter serves them
/// all, so fences grow across the holders of the name. While any permit is held, the lock's own
/// key holds `permits:<N>`, renewed (only ever extended) by every holder and freed by the last
/// one out: an exclusive or shared caller, or one that gives another N, finds the name held in
/// another mode and is refused, as are callers of this N while the key holds anything else.
///
/// Arrival order: waiters queue as a lock's do, in the lock's queue; a caller takes a free permit
/// only while fewer live waiters queue before it (all of them, for a caller not in the queue)
/// than permits are free. A release with waiters queued grants its permit to the first of them
/// as a lock's release does (the permit's key holds that waiter's last token, and the grant
/// message names the permit, see `RELEASE`); a waiter that missed the message takes the grant
/// over with its next attempt.
///
/// Returns `{1, fence, index}` when permit `index` was taken; `{0, pttl}` when every permit is
/// held (the soonest expiry, -1 when none has one); `{2, head, state}` when a permit is free but
/// waiters before this caller come first; `{-3, value}` when the lock's key holds `value`:
/// another mode or another N; `{-1, type}` when the lock's key holds another type (`{-1, type,
/// key}` when the queue or its states do and the attempt meets them); `{-2, why}` when the fence
/// counter cannot give a fence
/// (see `lua/lib/counter.lua`; nothing is taken).
///
/// Parameters: [`super::calls::AcquirePermit`]; reply: [`super::replies::Attempt`].
pub(crate) static ACQUIRE_PERMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        lib!("marks"),
        lib!("counter"),
        lib!("queue"),
        lua!("acquire_permit")
    ))
});

/// For the token of an attempt on a lock with permits whose outcome is not known (its caller was
/// dropped mid-request): deletes the permit that holds the token (as written, or with the
/// waiters' mark set), if any, and then tells the waiters; the last permit out also frees the
/// lock's key of its mark (see `ACQUIRE_PERMIT`).
/// Returns 1 when a permit held it, else 0. An operator's forced release of a permit's value is
/// the same.
///
/// Parameters: [`super::calls::ForgetPermit`]; reply: [`super::replies::Forgot`].
pub(crate) static FORGET_PERMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        lib!("marks"),
        lib!("permits"),
        lua!("forget_permit")
    ))
});

/// A shared hold of a read-write lock. The lock's key holds `shared:<token of the first shared
/// holder>` while shared holders hold it: an exclusive caller's `SET NX` finds it busy, so the
/// exclusive path is the same whether or not the name has shared holders. Each shared holder has
/// a place in the holders' set (member `<token> <fence>`, scored by its own expiry on the
/// server's clock in ms), and renews both that place and the lock's key (with the key's value
/// as its token; `RENEW` only ever extends such a key). A holder's place ends with its own
/// lease: a holder that crashed is no longer counted once its lease has run out, and the release
/// of the last live holder releases the key as an exclusive holder would (`RELEASE_SHARED`).
///
/// Arrival order: a shared caller joins while the key is free or shared, unless an exclusive
/// waiter queued before it (or, for a caller not in the queue, anywhere in it). Its queue state
/// is `"<nonce> <grace ms>"`, without the ttl of an exclusive waiter's: a release hands it the
/// lock by id (`~<waiter id>`), and it takes the key over as shared. One that joins with more
/// shared waiters next in line wakes them, so that they join too.
///
/// Returns `{1, fence, value, member}` when held (the key's value, which this holder renews, and
/// its place in the holders' set); otherwise as `ACQUIRE`: `{0, pttl}`, `{2, head, state}`,
/// `{-1, type}` (`{-1, type, key}` for a derived key), `{-2, why}`, `{-3, value}`.
///
/// Parameters: [`super::calls::AcquireShared`]; reply: [`super::replies::Attempt`].
pub(crate) static ACQUIRE_SHARED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        lib!("marks"),
        lib!("counter"),
        lib!("queue"),
        lua!("acquire_shared")
    ))
});

/// The release of a shared hold: takes the holder out of the set, with every holder whose lease
/// has run out; the last live one out releases the lock's key as `RELEASE` does (kept for
/// `min_hold`, or granted to the first waiter, or deleted). While others still hold it, the key
/// is cut down to the longest of their leases (it may have been extended for the leaver's), and
/// the waiters are told, so that they retry by the new expiry. Returns as `RELEASE`: 1, the
/// grant, or 0 when the key or the set no longer holds this holder (then nothing is touched).
///
/// Parameters: [`super::calls::ReleaseShared`]; reply: [`super::replies::Released`].
pub(crate) static RELEASE_SHARED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        lib!("marks"),
        lib!("counter"),
        lib!("hand_over"),
        lua!("release_shared")
    ))
});

/// The renewal of many leases on one Redis Cluster primary, whatever their slots: their keys go
/// among the arguments (keys of several slots cannot be declared in one call).
/// `allow-cross-slot-keys` lets the script touch keys of the slots this primary serves.
/// Returns one integer per lease: 1 renewed, 0 no longer ours, 2 not served here (its slot moved
/// to another primary, or is moving): the caller sends that one again, routed by its key.
/// Needs Redis 7.0 (script flags), as sharded pub/sub does.
///
/// Parameters: [`super::calls::RenewAnySlot`]; reply: one [`super::replies::Renewal`] per lease.
pub(crate) static RENEW_ANY_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        "#!lua flags=allow-cross-slot-keys\n",
        lib!("marks"),
        lib!("renew_one"),
        lua!("renew_any_slot")
    ))
});

/// The fence of a lease taken without one (see `LockOptions::without_fence`), for a nested call
/// that can read it: computed as `ACQUIRE` does (`max(counter + 1, clock in µs)`) and written to
/// the counter, only while the key holds the token (or its marked form). Returns `{1, fence}`;
/// `{0}` when the key is not ours (nothing touched); `{-2, value}` when the counter is not a
/// number.
///
/// Parameters: [`super::calls::Fence`]; reply: [`super::FenceReply`].
pub(crate) static FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(concat!(lib!("marks"), lib!("counter"), lua!("fence"))));

/// Raises the fence counter to a fence (one a Redlock majority agreed on, written to the nodes
/// that were behind) if it is lower. Returns 1; `{-2, why}` when the key is not a counter it
/// can raise (then it is left as it is).
///
/// Parameters: [`super::calls::RaiseFence`]; reply: [`super::replies::Raised`].
pub(crate) static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(concat!(lib!("counter"), lua!("raise_fence"))));

/// `EVALSHA <sha> <numkeys>`; the caller appends the keys, then the arguments (`args` in all,
/// about `bytes` long). Written straight into one buffer sized up front: no copy of every
/// argument (as `ScriptInvocation` makes) and no regrowth on the way.
pub(crate) fn evalsha(script: &Script, numkeys: usize, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(args + 3, bytes + 60);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(numkeys);
    cmd
}
