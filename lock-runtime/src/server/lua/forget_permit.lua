-- FORGET_PERMIT: frees the permit an attempt of unknown outcome may hold (see `scripts.rs`).
local lock = KEYS[1]
local token, channel, publish = ARGV[1], ARGV[2], ARGV[3]
local unmarked, marked, permits_mark = ARGV[4], ARGV[5], ARGV[6]
local permits = {}
for i = 2, #KEYS do permits[#permits + 1] = KEYS[i] end

local freed = false
for _, permit in ipairs(permits) do
  if not freed and is_ours(redis.pcall('GET', permit), token, unmarked, marked) then
    redis.call('DEL', permit)
    redis.call(publish, channel, token)
    freed = true
  end
end
if not freed then return 0 end
free_mark(lock, permits, permits_mark)
return 1
