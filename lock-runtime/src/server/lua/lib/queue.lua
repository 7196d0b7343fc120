-- The waiter queue: a sorted set of waiter ids scored by arrival number, and a hash of each
-- waiter's state.

-- `{-1, type, key}` when `key` holds a type other than `kind` (another client's key, or a lock
-- of the other key format under the same name); nil when it is of that type or absent.
local function foreign(key, kind)
  local found = redis.call('TYPE', key).ok
  if found ~= 'none' and found ~= kind then return {-1, found, key} end
end

-- Runs `attempt` and returns its reply. When one of its commands met a key of another type at
-- one of `names` (`{key, kind}` pairs: another client's keys at the queue's names), the reply is
-- `foreign`'s for the first of them instead: the types are read only then, not on every
-- attempt. Such a command fails before it writes, and the scripts touch those keys in an order
-- that leaves them as they were, but for the attempt's waiter taken out of its own queue.
local function unless_foreign(attempt, names)
  local ok, out = pcall(attempt)
  if ok then return out end
  -- The error is a table or a string, depending on the Redis version.
  local text = type(out) == 'table' and out.err or out
  if type(text) == 'string' and string.find(text, 'WRONGTYPE', 1, true) then
    for _, name in ipairs(names) do
      local refused = foreign(name[1], name[2])
      if refused then return refused end
    end
  end
  error(out)
end

-- Takes `waiter` out of the queue, with its state.
local function leave_queue(queue, states, waiter)
  redis.call('ZREM', queue, waiter)
  redis.call('HDEL', states, waiter)
end

-- Evicts the queue head `evict` (a waiter id; empty: none) if its state is still `seen`, the
-- state a caller saw it in for longer than its grace (see `ACQUIRE`), with any of the `locks`
-- keys handed to it by id (`handed` and its id).
local function evict_stale_head(queue, states, evict, seen, locks, handed)
  if evict == '' or redis.call('HGET', states, evict) ~= seen then return end
  leave_queue(queue, states, evict)
  for _, key in ipairs(locks) do
    if redis.pcall('GET', key) == handed .. evict then redis.call('DEL', key) end
  end
end

-- Puts `waiter` at the end of the queue unless it is in it (looked up only when
-- `maybe_queued`), and writes its `state`: the queue read, then the state written, then the
-- queue (see `unless_foreign`). True when the queue was new.
local function enter_queue(queue, states, waiter, state, maybe_queued)
  local queued, last = maybe_queued and redis.call('ZSCORE', queue, waiter), nil
  if not queued then last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')[2] end
  redis.call('HSET', states, waiter, state)
  if queued then return false end
  redis.call('ZADD', queue, 'NX', (tonumber(last) or 0) + 1, waiter)
  return not last
end

-- Keeps the queue and the states for 4 graces (`grace_ms`), extended once less than half of
-- that is left (or the queue was `created`): never shortened, and a live waiter, back within
-- its grace, always finds them.
local function keep_queue(queue, states, grace_ms, created)
  local keep = 4 * tonumber(grace_ms)
  if created or redis.call('PTTL', states) < keep / 2 then
    redis.call('PEXPIRE', queue, keep)
    redis.call('PEXPIRE', states, keep)
  end
end

-- Puts `waiter` at the end of the queue unless it is in it, writes its `state`, and keeps both
-- for 4 of its graces.
local function join_queue(queue, states, waiter, state, grace_ms)
  enter_queue(queue, states, waiter, state, true)
  keep_queue(queue, states, grace_ms, false)
end

-- When the lock's value `cur` hands it to a waiter by id (`handed` and its id, see `RELEASE`):
-- `{2, that waiter, its state}`; nil otherwise.
local function handed_to_another(cur, states, handed)
  if starts_with(cur, handed) then
    local head = string.sub(cur, #handed + 1)
    return {2, head, redis.call('HGET', states, head)}
  end
end
