-- ACQUIRE: one attempt on a lock's key, by a waiter or a Redlock node (see `scripts.rs`).
local lock, counter, queue, states = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl_ms, quantum, retention_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local waiter, grace_ms, evict, seen, previous = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local unmarked, marked, handed, permits_mark = ARGV[10], ARGV[11], ARGV[12], ARGV[13]

local function attempt()
  -- No `EXISTS` first: an absent queue has no head.
  evict_stale_head(queue, states, evict, seen, {lock}, handed)
  -- The first live waiter in line, nil when it is this caller; the heads before it without a
  -- state leave the queue. Looked up only where it decides (the key free, or held without an
  -- expiry): behind a holder, a waiter joins the queue without it.
  local first, looked = nil, false
  local function first_in_line()
    if looked then return first end
    looked = true
    while true do
      first = redis.call('ZRANGE', queue, 0, 0)[1]
      if not first or redis.call('HEXISTS', states, first) == 1 then break end
      redis.call('ZREM', queue, first)
    end
    if first == waiter then first = nil end
    return first
  end
  local cur = redis.pcall('GET', lock)
  if type(cur) == 'table' then return {-1, redis.call('TYPE', lock).ok} end
  -- Held by permits (see `ACQUIRE_PERMIT`): another mode, which this caller must not wait for.
  if starts_with(cur, permits_mark) then return {-3, cur} end
  -- Handed to this waiter: granted to its previous token, or handed over by id.
  local ours = cur and waiter ~= '' and (cur == handed .. waiter or (previous ~= '' and
    (cur == previous or cur == with_mark(previous, unmarked, marked))))
  if ours or (not cur and not first_in_line()) then
    local last = redis.pcall('GET', counter)
    local why = unusable(last)
    if why then return {-2, why} end
    local value = token
    if waiter ~= '' then
      leave_queue(queue, states, waiter)
      -- Others still queue: the release of this lease has the lock to hand over.
      if redis.call('EXISTS', queue) == 1 then value = with_mark(value, unmarked, marked) or value end
    end
    redis.call('SET', lock, value, 'PX', ttl_ms)
    local fence = next_fence(counter, last, quantum, retention_ms)
    return {1, fence}
  end
  if waiter ~= '' then
    -- A waiter's first attempt (no previous token) is not in the queue yet (`NX` all the same);
    -- a later one usually is.
    local state = token .. ' ' .. ttl_ms .. ' ' .. grace_ms
    local created = enter_queue(queue, states, waiter, state, previous ~= '')
    keep_queue(queue, states, grace_ms, created)
    -- Queued behind a holder: its release hands the lock over.
    mark_in_place(lock, cur, unmarked, marked)
  end
  local other = handed_to_another(cur, states, handed)
  if other then return other end
  local pttl = redis.call('PTTL', lock)
  if pttl < 0 and first_in_line() then
    return {2, first, redis.call('HGET', states, first)}
  end
  return {0, pttl}
end

return unless_foreign(attempt, {{queue, 'zset'}, {states, 'hash'}})
