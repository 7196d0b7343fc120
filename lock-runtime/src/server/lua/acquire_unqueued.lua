-- ACQUIRE_UNQUEUED: one attempt on a server that keeps no waiter queue (see `scripts.rs`).
local lock, counter = KEYS[1], KEYS[2]
local token, ttl_ms, quantum, retention_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local permits_mark = ARGV[5]

if not redis.call('SET', lock, token, 'NX', 'PX', ttl_ms) then
  local cur = redis.pcall('GET', lock)
  if type(cur) == 'table' then return {-1, redis.call('TYPE', lock).ok} end
  if starts_with(cur, permits_mark) then return {-3, cur} end
  return {0, redis.call('PTTL', lock)}
end
local last = redis.pcall('GET', counter)
local why = unusable(last)
if why then
  redis.call('DEL', lock)
  return {-2, why}
end
local fence = next_fence(counter, last, quantum, retention_ms)
return {1, fence}
