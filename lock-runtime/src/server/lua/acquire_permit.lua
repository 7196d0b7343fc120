-- ACQUIRE_PERMIT: one attempt on a lock with `permits = N` (see `scripts.rs`).
local lock, counter, queue, states = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl_ms, quantum, retention_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local mark = ARGV[5]
local waiter, grace_ms, evict, seen, previous = ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local handed, unmarked, marked = ARGV[11], ARGV[12], ARGV[13]
-- The keys of permits 0 to N - 1 follow the lock's own keys.
local permits = {}
for i = 5, #KEYS do permits[#permits + 1] = KEYS[i] end

local cur = redis.pcall('GET', lock)
if type(cur) == 'table' then return {-1, redis.call('TYPE', lock).ok} end
-- The lock's key says the mode of its holders: permits with the same N join, anyone else is
-- another mode (or another N), refused rather than waited for.
if cur and cur ~= mark then return {-3, cur} end
local function attempt()
  evict_stale_head(queue, states, evict, seen, permits, handed)
  local free, mine, soonest = {}, nil, nil
  for i, permit in ipairs(permits) do
    local value = redis.pcall('GET', permit)
    if not value then
      free[#free + 1] = i
    elseif waiter ~= '' and (value == handed .. waiter or (previous ~= '' and
        (value == previous or value == with_mark(previous, unmarked, marked)))) then
      mine = i
    else
      local pttl = redis.call('PTTL', permit)
      if pttl >= 0 and (not soonest or pttl < soonest) then soonest = pttl end
    end
  end
  -- The live waiters queued before this caller, and the first of them: read only when a permit
  -- is free, the one case where they decide (with every permit held, a waiter joins the queue
  -- without them).
  local ahead, first = 0, nil
  if not mine and #free > 0 then
    for _, id in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
      if id == waiter then break end
      if redis.call('HEXISTS', states, id) == 1 then
        ahead = ahead + 1
        first = first or id
      else
        redis.call('ZREM', queue, id)
      end
    end
  end
  local taken = mine or (ahead < #free and free[1])
  if taken then
    local last = redis.pcall('GET', counter)
    local why = unusable(last)
    if why then return {-2, why} end
    -- Out of the queue before the permit is written (see `unless_foreign`).
    if waiter ~= '' then leave_queue(queue, states, waiter) end
    redis.call('SET', permits[taken], token, 'PX', ttl_ms)
    -- The mark lives as long as the longest lease of the permits' holders (each renews it).
    if not cur then
      redis.call('SET', lock, mark, 'PX', ttl_ms)
    elseif redis.call('PTTL', lock) < tonumber(ttl_ms) then
      redis.call('PEXPIRE', lock, ttl_ms)
    end
    local fence = next_fence(counter, last, quantum, retention_ms)
    return {1, fence, taken - 1}
  end
  if waiter ~= '' then
    join_queue(queue, states, waiter, token .. ' ' .. ttl_ms .. ' ' .. grace_ms, grace_ms)
  end
  if #free > 0 and first then return {2, first, redis.call('HGET', states, first)} end
  return {0, soonest or -1}
end

return unless_foreign(attempt, {{queue, 'zset'}, {states, 'hash'}})
