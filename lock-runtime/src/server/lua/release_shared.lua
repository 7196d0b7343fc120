-- RELEASE_SHARED: the release of one shared holder (see `scripts.rs`).
local lock, readers, queue, states, counter = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, member, retention_ms, publish, keep_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local channel, grant_prefix, grants, handed = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local unmarked, marked, kept, shared_mark = ARGV[10], ARGV[11], ARGV[12], ARGV[13]

local value = redis.pcall('GET', lock)
if not starts_with(value, shared_mark) then return 0 end
if token == '' then token = value end
if not is_ours(value, token, unmarked, marked) then return 0 end
if redis.call('TYPE', readers).ok ~= 'zset' then return 0 end
-- Holders whose lease ran out (dead ones) leave first.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
if not redis.call('ZSCORE', readers, member) then
  -- Only the token is known: its place is the member that starts with it.
  local prefix = member .. ' '
  member = nil
  for _, m in ipairs(redis.call('ZRANGE', readers, 0, -1)) do
    if string.sub(m, 1, #prefix) == prefix then member = m break end
  end
  if not member then return 0 end
end
redis.call('ZREM', readers, member)
local longest = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')[2]
if longest then
  local left = tonumber(longest) - now
  if redis.call('PTTL', lock) > left then
    redis.call('PEXPIRE', lock, left)
    if redis.call('EXISTS', queue) == 1 then redis.call(publish, channel, value) end
  end
  return 1
end
redis.call('DEL', readers)
local holder = string.match(member, '^(%S+)')
if tonumber(keep_ms) > 0 then
  redis.call('SET', lock, holder .. kept, 'PX', keep_ms)
  return 1
end
local function free_key() redis.call('DEL', lock) end
local keys = {key = lock, queue = queue, states = states, counter = counter}
local args = {
  token = token, channel = channel, grant_prefix = grant_prefix, grants = grants,
  publish = publish, retention_ms = retention_ms, handed = handed, unmarked = unmarked,
  marked = marked, permit = '',
}
local granted = hand_over(keys, args, function() end, free_key)
if granted then return granted end
free_key()
return 1
