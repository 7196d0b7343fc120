//! The Lua scripts. Each is loaded once per connection and then sent as EVALSHA
//! (`redis::Script` falls back to loading it on NOSCRIPT, e.g. after a server restart).

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock, fence, waiter queue, waiter deadlines. ARGV: token, ttl ms, waiter id (empty: not
/// queuing), waiter grace ms.
/// Returns `{1, fence}` when taken, `{0, pttl}` when busy, `{-1, type}` when the key holds another
/// type, `{-2, error}` when the fence counter is not a counter (the lock key is then removed again).
///
/// Waiters queue in arrival order and the lock goes to the head of the queue: a free lock is busy
/// for everyone else while someone older waits. A waiter that stops coming back (crashed, or
/// cancelled without cleaning up) drops out `grace` after its last attempt. When the lock is free
/// but not ours, the busy reply carries how long until the head's place runs out.
///
/// A missing fence counter (first use, or a server restarted without persistence) starts at the
/// server's clock in microseconds, not at 0: fewer than one acquisition per microsecond ever
/// happens, so the fence keeps growing across such a restart as long as the clock does not go back.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local waiter, grace = ARGV[3], tonumber(ARGV[4])
local now_us, now, first
if redis.call('EXISTS', KEYS[3]) == 1 then
  local t = redis.call('TIME')
  now_us = t[1] * 1000000 + t[2]
  now = math.floor(now_us / 1000)
  local stale = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
  for _, gone in ipairs(stale) do
    redis.call('ZREM', KEYS[3], gone)
    redis.call('ZREM', KEYS[4], gone)
  end
  first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if first == waiter then first = nil end
end
if not first then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local fence = redis.pcall('INCR', KEYS[2])
    if type(fence) == 'table' and fence.err then
      redis.call('DEL', KEYS[1])
      return {-2, fence.err}
    end
    if fence == 1 then
      -- The counter was missing (a counter that started from the clock never comes back to 1).
      local t = redis.call('TIME')
      fence = t[1] * 1000000 + t[2]
      redis.call('SET', KEYS[2], string.format('%d', fence))
    end
    if waiter ~= '' then
      redis.call('ZREM', KEYS[3], waiter)
      redis.call('ZREM', KEYS[4], waiter)
    end
    return {1, fence}
  end
  local kind = redis.call('TYPE', KEYS[1]).ok
  if kind ~= 'string' then return {-1, kind} end
end
-- Busy, or free but someone queued first: take (or keep) a place in the queue.
if waiter ~= '' then
  if not now_us then
    local t = redis.call('TIME')
    now_us = t[1] * 1000000 + t[2]
    now = math.floor(now_us / 1000)
  end
  -- Arrival order by the microsecond, so that ties (broken by name) practically never happen.
  redis.call('ZADD', KEYS[3], 'NX', now_us, waiter)
  redis.call('ZADD', KEYS[4], now + grace, waiter)
  redis.call('PEXPIRE', KEYS[3], 2 * grace)
  redis.call('PEXPIRE', KEYS[4], 2 * grace)
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 and first then
  -- Free, but not our turn: retry when the first waiter's place runs out, or on a release.
  pttl = math.max(0, tonumber(redis.call('ZSCORE', KEYS[4], first) or now) - now)
end
return {0, pttl}
",
    )
});

/// KEYS: lock keys. ARGV: token and ttl ms for each key, in order.
/// Returns one integer per key: 1 when renewed, 0 when the key no longer holds the token.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for i, key in ipairs(KEYS) do
  local value = redis.pcall('GET', key)
  if value == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
",
    )
});

/// KEYS: lock. ARGV: token, ms to keep the key (0: delete it), release channel.
/// Returns 1 when the key was ours, 0 when it was not (it is then left untouched).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[1])
end
return 1
",
    )
});

/// KEYS: fence. ARGV: a fence value. Raises the counter to the value if it is lower (Redlock).
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if current < wanted then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
",
    )
});
