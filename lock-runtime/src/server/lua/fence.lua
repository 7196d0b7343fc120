-- FENCE: the fence of a lease taken without one (see `scripts.rs`).
local lock, counter = KEYS[1], KEYS[2]
local token, retention_ms, unmarked, marked = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if not is_ours(redis.pcall('GET', lock), token, unmarked, marked) then
  return {0}
end
local last = redis.pcall('GET', counter)
local why = unusable(last)
if why then return {-2, why} end
local fence = next_fence(counter, last, 1, retention_ms)
return {1, fence}
