//! The Lua scripts. Each is sent as EVALSHA; on NOSCRIPT (a new or restarted server) the node
//! loads it once and sends it again (see `Node::eval`).

use std::sync::LazyLock;

use redis::Script;

/// The default fence counter retention in ms (`DEFAULT_FENCE_RETENTION`, 7 days), as the
/// release script's default for its second argument: the common release need not send it.
macro_rules! default_retention_ms {
    () => {
        "604800000"
    };
}

/// [`default_retention_ms!`] as a number (`DEFAULT_FENCE_RETENTION` is made from it), for the
/// callers that decide whether to send it.
pub(crate) const DEFAULT_RETENTION_MS: u64 = 604_800_000;

/// Lua, for the scripts that check a lease's key: whether `value` (the key's `GET`) is the lease's
/// `token`, as written or with the waiters' mark set (see `ACQUIRE`).
macro_rules! ours {
    () => {
        "(value == token or (type(value) == 'string' and string.sub(token, -4) == ';w=0' \
         and value == string.sub(token, 1, -2) .. '1'))"
    };
}

/// Lua: `renew_one(key, token, ttl)`, the renewal of one lease: 1 renewed, 0 not ours (nothing
/// touched), nil when the key is not served here (an error other than a wrong type: on Redis
/// Cluster, a slot that moved). A value that every holder of a shared hold or of permits renews
/// (`shared:..`, `permits:..`) is only ever extended: its holders may have leases of different
/// lengths. A sorted set is a set of shared holders (see `ACQUIRE_SHARED`), each scored by its
/// own expiry on the server's clock (ms): renewing one moves that expiry, unless it has passed.
macro_rules! renew_one {
    () => {
        concat!(
            r"local function renew_one(key, token, ttl)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' then
    if not string.find(value.err or '', 'WRONGTYPE', 1, true) then return nil end
    local at = redis.pcall('ZSCORE', key, token)
    if type(at) ~= 'string' then return 0 end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if tonumber(at) <= now then return 0 end
    redis.call('ZADD', key, 'XX', now + tonumber(ttl), token)
    if redis.call('PTTL', key) < tonumber(ttl) then redis.call('PEXPIRE', key, ttl) end
    return 1
  end
  if not ",
            ours!(),
            r" then return 0 end
  local many = string.sub(value, 1, 7) == 'shared:' or string.sub(value, 1, 8) == 'permits:'
  if not many or redis.call('PTTL', key) < tonumber(ttl) then redis.call('PEXPIRE', key, ttl) end
  return 1
end
"
        )
    };
}

/// The largest fence: the largest integer a Lua number (a double) holds exactly. A counter at or
/// above it gives no more fences (an error, never a smaller fence).
pub(crate) const MAX_FENCE: u64 = (1 << 53) - 1;

/// Lua: `unusable(last)`, why the fence counter's `GET` (by `pcall`) `last` cannot give the next
/// fence (another type, not an integer, or at [`MAX_FENCE`]); nil when it can.
macro_rules! unusable_counter {
    () => {
        r"local function unusable(last)
  if type(last) == 'table' then return 'holds a value of another type, not an integer counter' end
  if not last then return nil end
  local n = tonumber(last)
  if not n or n < 0 or n ~= math.floor(n) then
    return 'holds ' .. last .. ', not an integer counter'
  end
  if n >= 9007199254740991 then
    return 'is at ' .. last .. ', at or above the largest fence (2^53 - 1): fences cannot go higher'
  end
end
"
    };
}

/// Lua, for the acquire scripts once the key is taken: the fence `max(counter + 1, floor)` from
/// `last` (the counter's `GET`, checked to be a number or nil), as `fence`, written to the
/// counter (KEYS[2], kept ARGV[4] ms, 0: forever). ARGV[3] is the floor's quantum (see `ACQUIRE`).
macro_rules! next_fence {
    () => {
        r"  last = tonumber(last) or 0
  local t = redis.call('TIME')
  local s = tonumber(t[1])
  local now = s * 1000000 + tonumber(t[2])
  local quantum = tonumber(ARGV[3])
  if quantum > 1 and redis.call('LASTSAVE') < s then now = now - now % quantum end
  local fence = math.max(last + 1, now)
  if ARGV[4] ~= '0' then
    redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[4])
  else
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
"
    };
}

/// [`next_fence!`], then returns `{1, fence}` (with `$more`, as `{1, fence, $more}`).
macro_rules! take_fence {
    () => {
        take_fence!("")
    };
    ($more:literal) => {
        concat!(next_fence!(), "  return {1, fence", $more, "}\n")
    };
}

/// Lua, for the acquire scripts of a lock's key: evicts the queue head `$evict` (a waiter id;
/// empty: none) if its state is still `$seen`, the state a caller saw it in for longer than its
/// grace (see `ACQUIRE`), with the key if it was handed to that waiter by id.
macro_rules! evict_stale_head {
    ($evict:literal, $seen:literal) => {
        concat!(
            "local evict = ",
            $evict,
            " or ''\nif evict ~= '' and redis.call('HGET', KEYS[4], evict) == ",
            $seen,
            r" then
  redis.call('ZREM', KEYS[3], evict)
  redis.call('HDEL', KEYS[4], evict)
  if redis.pcall('GET', KEYS[1]) == '~' .. evict then redis.call('DEL', KEYS[1]) end
end
"
        )
    };
}

/// Lua, for the acquire scripts: when the lock's key `cur` is handed to a waiter by id
/// (`~<waiter id>`, see `RELEASE`), returns `{2, that waiter, its state}`.
macro_rules! handed_to_another {
    () => {
        r"if cur and string.sub(cur, 1, 1) == '~' then
  local head = string.sub(cur, 2)
  return {2, head, redis.call('HGET', KEYS[4], head)}
end
"
    };
}

/// Lua, for the acquire scripts of shared holds and permits: puts `waiter` at the end of the
/// queue (KEYS[3]) unless it is in it, writes its state `$state` (KEYS[4]), and keeps both for 4
/// of its graces `$grace` (ms), extended once less than half of that is left (see `ACQUIRE`).
macro_rules! join_queue {
    ($state:literal, $grace:literal) => {
        concat!(
            r"  if not redis.call('ZSCORE', KEYS[3], waiter) then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', KEYS[3], 'NX', (tonumber(last) or 0) + 1, waiter)
  end
  redis.call('HSET', KEYS[4], waiter, ",
            $state,
            r")
  local keep = 4 * tonumber(",
            $grace,
            r")
  if redis.call('PTTL', KEYS[4]) < keep / 2 then
    redis.call('PEXPIRE', KEYS[3], keep)
    redis.call('PEXPIRE', KEYS[4], keep)
  end
"
        )
    };
}

/// Lua, first in the acquire scripts that write the waiter queue (KEYS[3], a sorted set) and its
/// states (KEYS[4], a hash): returns `{-1, type, key}` when either holds another type (another
/// client's key, or a lock of the other key format under the same name), before anything is
/// written.
macro_rules! refuse_foreign_queue {
    () => {
        r"local function foreign(key, kind)
  local found = redis.call('TYPE', key).ok
  if found ~= 'none' and found ~= kind then return {-1, found, key} end
end
local refused = foreign(KEYS[3], 'zset') or foreign(KEYS[4], 'hash')
if refused then return refused end
"
    };
}

/// KEYS: lock, fence, waiter queue, waiter states.
/// ARGV: 1 value (the token, also this attempt's nonce), 2 ttl ms, 3 fence quantum µs (1: one
/// server; 1000000: a Redlock node), 4 fence counter retention ms (0: forever); then, only for a
/// waiter: 5 waiter id, 6 waiter grace ms, 7 stale head to evict (empty: none), 8 the state that
/// head was seen with, 9 the token of this waiter's previous attempt (a release may have granted
/// the lock to it, see `RELEASE`; empty: none).
///
/// Returns `{1, fence}` when taken; `{0, pttl}` when held by someone else; `{2, head, state}` when
/// the lock is free, or handed to another waiter, and that waiter is first in line; `{-1, type}`
/// when the key holds another type (`{-1, type, key}` when the queue or its states do), `{-2,
/// why}` when the fence counter cannot give a fence (see `unusable_counter!`); `{-3, value}`
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
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        refuse_foreign_queue!(),
        r"local waiter = ARGV[5] or ''
-- A value with the waiters' mark set (see `holder.rs`); nil for one without the mark's field.
local function marked(value)
  if string.sub(value, -4) == ';w=0' then return string.sub(value, 1, -2) .. '1' end
end
-- No `EXISTS` first: an absent queue has no head.
",
        evict_stale_head!("ARGV[7]", "ARGV[8]"),
        r"local first
while true do
  first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not first or redis.call('HEXISTS', KEYS[4], first) == 1 then break end
  redis.call('ZREM', KEYS[3], first)
end
local queued = first == waiter
if queued then first = nil end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then return {-1, redis.call('TYPE', KEYS[1]).ok} end
-- Held by permits (see `ACQUIRE_PERMIT`): another mode, which this caller must not wait for.
if cur and string.sub(cur, 1, 8) == 'permits:' then return {-3, cur} end
-- Handed to this waiter: granted to its previous token, or marked `~<waiter id>` (a release that
-- hands the lock over by id).
local previous = ARGV[9] or ''
local handed = cur and waiter ~= '' and
  (cur == '~' .. waiter or (previous ~= '' and (cur == previous or cur == marked(previous))))
if handed or (not cur and not first) then
",
        unusable_counter!(),
        r"  local last = redis.pcall('GET', KEYS[2])
  local why = unusable(last)
  if why then return {-2, why} end
  local value = ARGV[1]
  if waiter ~= '' then
    redis.call('ZREM', KEYS[3], waiter)
    redis.call('HDEL', KEYS[4], waiter)
    -- Others still queue: the release of this lease has the lock to hand over.
    if redis.call('EXISTS', KEYS[3]) == 1 then value = marked(value) or value end
  end
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
",
        take_fence!(),
        r"end
if waiter ~= '' then
  -- A waiter's first attempt (no previous token) is not in the queue yet (`NX` all the same);
  -- a later one usually is.
  local created = false
  if not queued and (previous == '' or not redis.call('ZSCORE', KEYS[3], waiter)) then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
    created = not last
    redis.call('ZADD', KEYS[3], 'NX', (tonumber(last) or 0) + 1, waiter)
  end
  redis.call('HSET', KEYS[4], waiter, ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[6])
  -- Extended to 4 graces once less than half of that is left (or the queue is new): never
  -- shortened, and a live waiter, back within a third of its grace, always finds it.
  local keep = 4 * tonumber(ARGV[6])
  if created or redis.call('PTTL', KEYS[4]) < keep / 2 then
    redis.call('PEXPIRE', KEYS[3], keep)
    redis.call('PEXPIRE', KEYS[4], keep)
  end
  -- Queued behind a holder: mark its value in place (the key keeps its expiry), so that its
  -- release hands the lock over.
  if cur and string.sub(cur, -4) == ';w=0' then
    redis.call('SETRANGE', KEYS[1], #cur - 1, '1')
  end
end
",
        handed_to_another!(),
        r"local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 and first then
  return {2, first, redis.call('HGET', KEYS[4], first)}
end
return {0, pttl}
",
    ))
});

/// KEYS: lock, fence. ARGV: 1 value (the token), 2 ttl ms, 3 fence quantum µs, 4 fence counter
/// retention ms (0: forever); as `ACQUIRE`'s first four.
///
/// An attempt on a server that keeps no waiter queue for the lock (a Redlock node: nobody queues
/// across several servers): `SET NX PX` first, and the fence (as `ACQUIRE` computes it) only
/// once the key is taken. Replies as `ACQUIRE` does for a caller that does not wait: `{1, fence}`,
/// `{0, pttl}`, `{-1, type}` (the key holds another type), `{-2, error}` (the counter is not a
/// counter; the key just taken is deleted again), `{-3, value}` (permits hold the name). It skips `ACQUIRE`'s look at the queue, its
/// `GET` of the key and its hand-over checks, which cost a Redlock node about an eighth of the
/// script's time.
pub(crate) static ACQUIRE_UNQUEUED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local cur = redis.pcall('GET', KEYS[1])
  if type(cur) == 'table' then return {-1, redis.call('TYPE', KEYS[1]).ok} end
  if string.sub(cur, 1, 8) == 'permits:' then return {-3, cur} end
  return {0, redis.call('PTTL', KEYS[1])}
end
",
        unusable_counter!(),
        r"local last = redis.pcall('GET', KEYS[2])
local why = unusable(last)
if why then
  redis.call('DEL', KEYS[1])
  return {-2, why}
end
",
        take_fence!(),
    ))
});

/// KEYS: lock keys (or sets of shared holders). ARGV: token (or a shared holder's member) and
/// ttl ms for each key, in order.
/// Returns one integer per key: 1 when renewed, 0 when the key no longer holds the token (as
/// written, or with the waiters' mark set: see `ACQUIRE`), or the set no longer holds the
/// member (see `renew_one!`).
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_CODE));

/// The text of [`RENEW`], for a `SCRIPT LOAD` sent ahead of the first renewal.
pub(crate) const RENEW_CODE: &str = concat!(
    renew_one!(),
    r"local out = {}
for i, key in ipairs(KEYS) do
  out[i] = renew_one(key, ARGV[2 * i - 1], ARGV[2 * i]) or 0
end
return out
",
);

/// Lua, for the release scripts once the key is no longer held: with waiters queued, grants the
/// lock to the first live one and returns (see `RELEASE`); falls through when nobody queues. Uses
/// `key`, `token` (published when the head cannot be granted the lock), `queue`, `counter`,
/// `channel`, `publish`, `retention`, `unusable` (see `unusable_counter!`), and the host's
/// `hold_mark(ms)` (keeps a permit's lock key marked while the permit is handed over) and
/// `free_key()` (deletes the key).
macro_rules! hand_over {
    () => {
        r"-- The first two in line: a queue exists if it has a first, and others still queue after the
-- first if it has a second. A queue name that holds another type (another client's key) is no
-- queue.
local line = redis.pcall('ZRANGE', queue, 0, 1)
if line.err then line = {} end
local head = line[1]
if head then
  local state = redis.call('HGET', queue .. ':state', head)
  local nonce, grace = nil, nil
  if state then nonce, grace = string.match(state, '^(%S+) %d+ (%d+)$') end
  local last = redis.pcall('GET', counter)
  if unusable(last) then nonce = nil end
  if nonce then
    redis.call('ZREM', queue, head)
    redis.call('HDEL', queue .. ':state', head)
    local held = nonce
    if string.sub(nonce, -4) == ';w=0' and line[2] then
      held = string.sub(nonce, 1, -2) .. '1'
    end
    redis.call('SET', key, held, 'PX', grace)
    hold_mark(grace)
    local t = redis.call('TIME')
    local fence = math.max((tonumber(last) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
    local f = string.format('%d', fence)
    if retention ~= '0' then
      redis.call('SET', counter, f, 'PX', retention)
    else
      redis.call('SET', counter, f)
    end
    local grant = '~' .. head .. ' ' .. nonce .. ' ' .. f
    -- A permit's key: the grant names the permit.
    local permit = string.match(key, ':permit:(%d+)$')
    if permit then grant = grant .. ' ' .. permit end
    local via = string.match(head, ';grants=(%w+)$')
    redis.call(publish, channel .. (via and ':' .. via or ''), grant)
    return grant
  end
  if state and string.match(state, '^%S+ %d+$') then
    -- Out of the queue: a second release meanwhile hands its key to the next in line.
    redis.call('ZREM', queue, head)
    redis.call('HDEL', queue .. ':state', head)
    local grace = string.match(state, ' (%d+)$')
    redis.call('SET', key, '~' .. head, 'PX', grace)
    hold_mark(grace)
    redis.call(publish, channel, '~' .. head)
    return '~' .. head
  end
  free_key()
  redis.call(publish, channel, token)
  return 1
end
"
    };
}

/// KEYS: lock; on Redis Cluster also its waiter queue and fence counter (declared keys: a slot
/// in migration then answers for all of them at once); for a permit's key, the queue and the
/// counter, then its lock's key and the keys of every permit of the lock (see `free_key`). ARGV: 1 token; then, each left out when
/// it and all after it have their default: 2 the fence counter's retention ms (the default:
/// 7 days, `DEFAULT_FENCE_RETENTION`; 0: forever), 3 the lease's
/// fence to record in the counter (0: already recorded), 4 the publish
/// command (`PUBLISH`; `SPUBLISH` on Redis Cluster: sharded pub/sub, the message goes only to
/// the primary of the lock's slot, where its waiters listen), 5 ms to keep the key (0: delete
/// it), 6 `1` to publish the release always (Redlock: no queue; `0`: only when waiters queue).
/// Not passed, the queue and the counter are named after the key (`<key>:waiters`,
/// `<key>:fence`, one slot; the queue's states are always `<key>:waiters:state`): every
/// argument costs the server a string on each call, and an uncontended release on one server
/// sends only the key and the token (and the retention when it is not the default; it takes
/// the shortest path through the script).
/// Returns 1 when the key was ours, `~<waiter id> <token> <fence>` (a permit's key: with the
/// permit's index after it) when it was and was granted to that waiter (`~<waiter id>` when handed over by id), 0 when it was not (then nothing is
/// touched). Ours: the key holds the token, or the token with the waiters' mark set.
///
/// - The short path: the key holds the token unmarked (no waiter queued behind this lease, see
///   `ACQUIRE`), and the arguments from the fifth on are left out (nothing to keep or publish):
///   the counter gets the fence when there is one to record, then `DEL`, and nothing else, not
///   even a look at the queue (the same for a fenced lease as for one without). A caller that
///   may have taken the key from under queued waiters (an undo) sends the fifth argument to go
///   the whole way.
/// - The fence counter gets the lease's fence here, for a lease taken by the plain-command path
///   (which does not write it): only while the key is still ours, so a lost lease never moves
///   the counter back.
/// - Kept for `min_hold`, the key gets a value that is no lease's token, so that a renewal of the
///   released lease still on its way cannot stretch it back to the full ttl.
/// - With waiters queued, the lock is granted to the first live one, taken out of the queue: the
///   key's value becomes the token of that waiter's last attempt (marked when others still
///   queue), for that waiter's grace (its lease extends the key to the ttl half-way through
///   what is left of the grace; a vanished waiter holds up the lock no longer than it would
///   have kept its place), and its fence is
///   computed here as the acquire script would (`max(counter + 1, clock in µs)`, also written to
///   the counter, kept for the locker's retention). `~<waiter id> <token> <fence>` is published on the grant
///   channel its id names (`;grants=<id>` at its end: `<key>:released:<id>`, which only the
///   waiters of its locker listen to), else on `<key>:released`: that waiter holds the lock as
///   soon as the message reaches it, with no attempt of its own (one round trip less per
///   hand-off), and the others sleep on (any other message wakes every waiter). A waiter whose
///   queue state has no ttl (`<nonce> <grace ms>`: a shared caller, or one waiting for a permit)
///   is handed the lock by id instead, and leaves the queue (a second release meanwhile goes to
///   the next in line): the key holds `~<waiter id>` for its grace, taken by the waiter's next
///   attempt. A counter that is
///   not a number is not touched (the DEL path: the waiter's attempt reports it). With nobody
///   queued nobody listens (a waiter queues before it waits), so nothing is published.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        r"
local key, token = KEYS[1], ARGV[1]
local value = redis.pcall('GET', key)
-- Deletes the key. A permit's key comes with its lock's key and every permit of the lock
-- (KEYS[4] and on): the last permit out also frees the lock's key of its mark `permits:<N>`.
local function free_key()
  redis.call('DEL', key)
  if not KEYS[5] then return end
  for i = 5, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 1 then return end
  end
  local mark = redis.pcall('GET', KEYS[4])
  if type(mark) == 'string' and string.sub(mark, 1, 8) == 'permits:' then
    redis.call('DEL', KEYS[4])
  end
end
-- Keeps a permit's lock key marked at least `ms` (its permit kept, or handed to a waiter).
local function hold_mark(ms)
  if KEYS[4] and redis.call('PTTL', KEYS[4]) < tonumber(ms) then
    redis.call('PEXPIRE', KEYS[4], ms)
  end
end
-- The common release takes the fewest steps: no waiter marked the value (so nobody queued behind
-- this holder), no keeping, no publishing always (ARGV[5] and on).
local short = value == token and not ARGV[5]
-- Ours with the waiters' mark set, or not ours (then nothing is touched).
if not short and not ",
        ours!(),
        r" then
  return 0
end
-- A fence to record (a lease taken by the plain-command path), while the key is still ours.
local retention, record = ARGV[2] or '",
        default_retention_ms!(),
        r"', ARGV[3] or '0'
-- Only ever raised, and only on a counter (a value this script did not write stays as it is).
if record ~= '0' then
  local counter = KEYS[3] or key .. ':fence'
  local last = redis.pcall('GET', counter)
  last = type(last) ~= 'table' and tonumber(last or '0')
  if last and last >= 0 and last % 1 == 0 and last < tonumber(record) then
    if retention ~= '0' then
      redis.call('SET', counter, record, 'PX', retention)
    else
      redis.call('SET', counter, record)
    end
  end
end
if short then
  free_key()
  return 1
end
",
        // Defined past the short path: the common release does not pay for it.
        unusable_counter!(),
        r"local counter = KEYS[3] or key .. ':fence'
local queue = KEYS[2] or key .. ':waiters'
-- The channels are named as the queue is: the queue's name without `:waiters`.
local channel = string.sub(queue, 1, -9) .. ':released'
local publish = ARGV[4] or 'PUBLISH'
local keep = tonumber(ARGV[5] or '0')
if keep > 0 then
  redis.call('SET', key, token .. ':released', 'PX', keep)
  hold_mark(keep)
  return 1
end
",
        hand_over!(),
        r"free_key()
if ARGV[6] == '1' then redis.call(publish, channel, token) end
return 1
",
    ))
});

/// KEYS: 1 the lock's key, 2 fence counter, 3 waiter queue, 4 waiter states, then the keys of
/// permits 0 to N - 1 (see `Keys::permit`). ARGV: 1 value (the token),
/// 2 ttl ms, 3 fence quantum µs, 4 fence counter retention ms (0: forever), as `ACQUIRE`'s first
/// four; 5 N; then, only for a waiter: 6 waiter id, 7 waiter grace ms, 8 stale head to evict
/// (empty: none), 9 the state that head was seen with, 10 the token of this waiter's previous
/// attempt (empty: none).
///
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
/// key}` when the queue or its states do); `{-2, why}` when the fence counter cannot give a fence
/// (see `unusable_counter!`; nothing is taken).
pub(crate) static ACQUIRE_PERMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        r"
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then return {-1, redis.call('TYPE', KEYS[1]).ok} end
-- The lock's key says the mode of its holders: permits with the same N join, anyone else is
-- another mode (or another N), refused rather than waited for.
local mark = 'permits:' .. ARGV[5]
if cur and cur ~= mark then return {-3, cur} end
",
        refuse_foreign_queue!(),
        r"local waiter, evict, previous = ARGV[6] or '', ARGV[8] or '', ARGV[10] or ''
if evict ~= '' and redis.call('HGET', KEYS[4], evict) == ARGV[9] then
  redis.call('ZREM', KEYS[3], evict)
  redis.call('HDEL', KEYS[4], evict)
  for i = 5, #KEYS do
    if redis.pcall('GET', KEYS[i]) == '~' .. evict then redis.call('DEL', KEYS[i]) end
  end
end
-- The live waiters queued before this caller, and the first of them.
local ahead, first = 0, nil
for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  if id == waiter then break end
  if redis.call('HEXISTS', KEYS[4], id) == 1 then
    ahead = ahead + 1
    first = first or id
  else
    redis.call('ZREM', KEYS[3], id)
  end
end
local free, mine, soonest = {}, nil, nil
for i = 5, #KEYS do
  local value = redis.pcall('GET', KEYS[i])
  if not value then
    free[#free + 1] = i
  elseif waiter ~= '' and (value == '~' .. waiter or (previous ~= '' and
      (value == previous or value == string.sub(previous, 1, -2) .. '1'))) then
    mine = i
  else
    local pttl = redis.call('PTTL', KEYS[i])
    if pttl >= 0 and (not soonest or pttl < soonest) then soonest = pttl end
  end
end
local taken = mine or (ahead < #free and free[1])
if taken then
",
        unusable_counter!(),
        r"  local last = redis.pcall('GET', KEYS[2])
  local why = unusable(last)
  if why then return {-2, why} end
  redis.call('SET', KEYS[taken], ARGV[1], 'PX', ARGV[2])
  if waiter ~= '' then
    redis.call('ZREM', KEYS[3], waiter)
    redis.call('HDEL', KEYS[4], waiter)
  end
  -- The mark lives as long as the longest lease of the permits' holders (each renews it).
  if not cur then
    redis.call('SET', KEYS[1], mark, 'PX', ARGV[2])
  elseif redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  local index = taken - 5
",
        take_fence!(", index"),
        r"end
if waiter ~= '' then
",
        join_queue!("ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[7]", "ARGV[7]"),
        r"end
if #free > 0 and first then return {2, first, redis.call('HGET', KEYS[4], first)} end
return {0, soonest or -1}
",
    ))
});

/// KEYS: 1 the lock's key, then the keys of permits 0 to N - 1. ARGV: 1 the token of an
/// attempt whose outcome is not known (its caller was dropped mid-request), 2 the lock's release
/// channel, 3 `PUBLISH` or `SPUBLISH`. Deletes the permit that holds the token (as written, or
/// with the waiters' mark set), if any, and then tells the waiters; the last permit out also
/// frees the lock's key of its mark (see `ACQUIRE_PERMIT`).
/// Returns 1 when a permit held it, else 0. An operator's forced release of a permit's value is
/// the same.
pub(crate) static FORGET_PERMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        r"
local token, freed = ARGV[1], false
for i = 2, #KEYS do
  local value = redis.pcall('GET', KEYS[i])
  if not freed and ",
        ours!(),
        r" then
    redis.call('DEL', KEYS[i])
    redis.call(ARGV[3], ARGV[2], ARGV[1])
    freed = true
  end
end
if not freed then return 0 end
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 1 end
end
local mark = redis.pcall('GET', KEYS[1])
if type(mark) == 'string' and string.sub(mark, 1, 8) == 'permits:' then
  redis.call('DEL', KEYS[1])
end
return 1
",
    ))
});

/// KEYS: 1 lock, 2 fence, 3 waiter queue, 4 waiter states, 5 shared holders (see
/// `Keys::readers`). ARGV: 1 token, 2 lease ms, 3 fence quantum µs, 4 fence counter retention
/// ms, as `ACQUIRE`'s first four; 5 the publish command (`PUBLISH`, `SPUBLISH` on Redis
/// Cluster); then, only for a waiter: 6 waiter id, 7 waiter grace ms, 8 stale head to evict
/// (empty: none), 9 the state that head was seen with.
///
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
pub(crate) static ACQUIRE_SHARED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        refuse_foreign_queue!(),
        r"local found = redis.call('TYPE', KEYS[5]).ok
if found ~= 'none' and found ~= 'zset' then return {-1, found, KEYS[5]} end
local waiter = ARGV[6] or ''
",
        evict_stale_head!("ARGV[8]", "ARGV[9]"),
        r"local line = redis.call('ZRANGE', KEYS[3], 0, -1)
-- Whether an exclusive waiter is queued before this caller; the first one in line.
local ahead, first = false, nil
for _, id in ipairs(line) do
  if id == waiter then break end
  local state = redis.call('HGET', KEYS[4], id)
  if state then
    first = first or id
    if not string.match(state, '^%S+ %d+$') then ahead = true break end
  else
    redis.call('ZREM', KEYS[3], id)
  end
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then return {-1, redis.call('TYPE', KEYS[1]).ok} end
-- Held by permits (see `ACQUIRE_PERMIT`): another mode, refused rather than waited for.
if cur and string.sub(cur, 1, 8) == 'permits:' then return {-3, cur} end
local shared = cur and string.sub(cur, 1, 7) == 'shared:'
local handed = cur and waiter ~= '' and cur == '~' .. waiter
if handed or ((not cur or shared) and not ahead) then
",
        unusable_counter!(),
        r"  local last = redis.pcall('GET', KEYS[2])
  local why = unusable(last)
  if why then return {-2, why} end
  if not shared then
    cur = 'shared:' .. ARGV[1]
    -- The holders of an earlier shared hold whose key was taken from them (a sorted set: ours).
    redis.call('DEL', KEYS[5])
    redis.call('SET', KEYS[1], cur, 'PX', ARGV[2])
  elseif redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  if waiter ~= '' then
    redis.call('ZREM', KEYS[3], waiter)
    redis.call('HDEL', KEYS[4], waiter)
  end
",
        next_fence!(),
        r"  -- This holder's place ends with its own lease (its renewals move it); the places of
  -- holders whose lease ran out (dead ones) go.
  local ms = s * 1000 + math.floor(tonumber(t[2]) / 1000)
  local member = ARGV[1] .. ' ' .. string.format('%d', fence)
  redis.call('ZADD', KEYS[5], ms + tonumber(ARGV[2]), member)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ms)
  if redis.call('PTTL', KEYS[5]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[5], ARGV[2]) end
  local next = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  local state = next and redis.call('HGET', KEYS[4], next)
  if state and string.match(state, '^%S+ %d+$') then
    local channel = string.sub(KEYS[3], 1, -9) .. ':released'
    redis.call(ARGV[5], channel, cur)
  end
  return {1, fence, cur, member}
end
if waiter ~= '' then
",
        join_queue!("ARGV[1] .. ' ' .. ARGV[7]", "ARGV[7]"),
        r"  -- Queued behind an exclusive holder: mark its value, so that its release hands the lock over.
  if cur and string.sub(cur, -4) == ';w=0' and not shared then
    redis.call('SETRANGE', KEYS[1], #cur - 1, '1')
  end
end
",
        handed_to_another!(),
        r"if not cur and first then
  return {2, first, redis.call('HGET', KEYS[4], first)}
end
return {0, redis.call('PTTL', KEYS[1])}
",
    ))
});

/// KEYS: 1 lock, 2 shared holders, 3 waiter queue, 4 fence counter. ARGV: 1 the key's value the
/// holder renews (empty: whatever shared value the key holds, for an attempt whose outcome is not
/// known), 2 the holder's place in the set (`<token> <fence>`, see `ACQUIRE_SHARED`), or only its
/// token when its place is not known, 3 the fence counter's retention ms, 4 the publish command,
/// 5 ms to keep the key (0: none).
///
/// The release of a shared hold: takes the holder out of the set, with every holder whose lease
/// has run out; the last live one out releases the lock's key as `RELEASE` does (kept for
/// `min_hold`, or granted to the first waiter, or deleted). While others still hold it, the key
/// is cut down to the longest of their leases (it may have been extended for the leaver's), and
/// the waiters are told, so that they retry by the new expiry. Returns as `RELEASE`: 1, the
/// grant, or 0 when the key or the set no longer holds this holder (then nothing is touched).
pub(crate) static RELEASE_SHARED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        r"
local key, token = KEYS[1], ARGV[1]
local value = redis.pcall('GET', key)
if type(value) ~= 'string' or string.sub(value, 1, 7) ~= 'shared:' then return 0 end
if token == '' then token = value end
if not ",
        ours!(),
        r" then return 0 end
if redis.call('TYPE', KEYS[2]).ok ~= 'zset' then return 0 end
-- Holders whose lease ran out (dead ones) leave first.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local member = ARGV[2]
if not redis.call('ZSCORE', KEYS[2], member) then
  -- Only the token is known: its place is the member that starts with it.
  local prefix = member .. ' '
  member = nil
  for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    if string.sub(m, 1, #prefix) == prefix then member = m break end
  end
  if not member then return 0 end
end
redis.call('ZREM', KEYS[2], member)
local queue, publish = KEYS[3], ARGV[4]
local channel = string.sub(queue, 1, -9) .. ':released'
local longest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
if longest then
  local left = tonumber(longest) - now
  if redis.call('PTTL', key) > left then
    redis.call('PEXPIRE', key, left)
    if redis.call('EXISTS', queue) == 1 then redis.call(publish, channel, value) end
  end
  return 1
end
redis.call('DEL', KEYS[2])
local holder = string.match(member, '^(%S+)')
local keep = tonumber(ARGV[5])
if keep > 0 then
  redis.call('SET', key, holder .. ':released', 'PX', keep)
  return 1
end
local function hold_mark(ms) end
local function free_key() redis.call('DEL', key) end
",
        unusable_counter!(),
        r"local counter, retention = KEYS[4], ARGV[3]
",
        hand_over!(),
        r"free_key()
return 1
",
    ))
});

/// The renewal of many leases on one Redis Cluster primary, whatever their slots: no KEYS (keys of
/// several slots cannot be declared in one call); ARGV: key, token and ttl ms for each lease, in
/// order. `allow-cross-slot-keys` lets the script touch keys of the slots this primary serves.
/// Returns one integer per lease: 1 renewed, 0 no longer ours, 2 not served here (its slot moved
/// to another primary, or is moving): the caller sends that one again, routed by its key.
/// Needs Redis 7.0 (script flags), as sharded pub/sub does.
pub(crate) static RENEW_ANY_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        "#!lua flags=allow-cross-slot-keys\n",
        renew_one!(),
        r"local out = {}
for i = 1, #ARGV / 3 do
  out[i] = renew_one(ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]) or 2
end
return out
",
    ))
});

/// `EVALSHA <sha> <numkeys>`; the caller appends the keys, then the arguments (`args` in all,
/// about `bytes` long). Written straight into one buffer sized up front: no copy of every
/// argument (as `ScriptInvocation` makes) and no regrowth on the way.
pub(crate) fn evalsha(script: &Script, numkeys: usize, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(args + 3, bytes + 60);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(numkeys);
    cmd
}

/// KEYS: lock, fence. ARGV: 1 token, 2 the counter's retention ms (0: forever).
/// The fence of a lease taken without one (see `LockOptions::without_fence`), for a nested call
/// that can read it: computed as `ACQUIRE` does (`max(counter + 1, clock in µs)`) and written to
/// the counter, only while the key holds the token (or its marked form). Returns `{1, fence}`;
/// `{0}` when the key is not ours (nothing touched); `{-2, value}` when the counter is not a
/// number.
pub(crate) static FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        unusable_counter!(),
        r"
local value, token = redis.pcall('GET', KEYS[1]), ARGV[1]
if not ",
        ours!(),
        r" then
  return {0}
end
local last = redis.pcall('GET', KEYS[2])
local why = unusable(last)
if why then return {-2, why} end
local t = redis.call('TIME')
local fence = math.max((tonumber(last) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
local f = string.format('%d', fence)
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[2], f, 'PX', ARGV[2])
else
  redis.call('SET', KEYS[2], f)
end
return {1, fence}
",
    ))
});

/// KEYS: fence. ARGV: a fence value, retention ms (0: forever). Raises the counter to the value
/// if it is lower (Redlock). Returns 1; `{-2, why}` when the key is not a counter it can raise
/// (then it is left as it is).
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        unusable_counter!(),
        r"
local last = redis.pcall('GET', KEYS[1])
local why = unusable(last)
if why then return {-2, why} end
if (tonumber(last) or 0) < tonumber(ARGV[1]) then
  if ARGV[2] ~= '0' then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  else
    redis.call('SET', KEYS[1], ARGV[1])
  end
end
return 1
",
    ))
});

#[cfg(test)]
mod tests {
    #[test]
    fn the_release_scripts_default_retention_is_the_lockers() {
        assert_eq!(
            default_retention_ms!(),
            super::DEFAULT_RETENTION_MS.to_string()
        );
    }
}
