-- RELEASE: compare-and-delete, keep for `min_hold`, or hand over to the first waiter (see
-- `scripts.rs`).
local lock, queue, states, counter = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- A permit's key comes with its lock's key and every permit of the lock.
local mark_key = KEYS[5]
local permits = {}
for i = 6, #KEYS do permits[#permits + 1] = KEYS[i] end
local token, retention_ms, record, publish = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local keep_ms, always, look = ARGV[5], ARGV[6], ARGV[7]
local channel, grant_prefix, grants, handed = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local unmarked, marked, kept, permits_mark, permit = ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[16]

-- Deletes the key; the last permit out also frees the lock's key of its permits' mark.
local function free_key()
  redis.call('DEL', lock)
  if mark_key then free_mark(mark_key, permits, permits_mark) end
end
-- Keeps a permit's lock key marked at least `ms` (its permit kept, or handed to a waiter).
local function hold_mark(ms)
  if mark_key and redis.call('PTTL', mark_key) < tonumber(ms) then
    redis.call('PEXPIRE', mark_key, ms)
  end
end

local value = redis.pcall('GET', lock)
-- The common release takes the fewest steps: no waiter marked the value (so nobody queued behind
-- this holder), no keeping, no publishing always, no look at the queue asked for.
local short = value == token and keep_ms == '0' and always == '0' and look == '0'
-- Ours with the waiters' mark set, or not ours (then nothing is touched).
if not short and not is_ours(value, token, unmarked, marked) then
  return 0
end
-- A permit holds the name only while the mark of its N keeps the other modes out. With the mark
-- gone (deleted, evicted) or another's, another mode may have been in beside it: the permit is
-- freed and the release says it was lost.
if mark_key and redis.pcall('GET', mark_key) ~= permits_mark .. #permits then
  free_key()
  redis.call(publish, channel, token)
  return 0
end
-- A fence to record (a lease taken by the plain-command path), while the key is still ours.
if record ~= '0' then raise_counter(counter, record, retention_ms) end
if short then
  free_key()
  return 1
end
if tonumber(keep_ms) > 0 then
  redis.call('SET', lock, token .. kept, 'PX', keep_ms)
  hold_mark(keep_ms)
  return 1
end
local keys = {key = lock, queue = queue, states = states, counter = counter}
local args = {
  token = token, channel = channel, grant_prefix = grant_prefix, grants = grants,
  publish = publish, retention_ms = retention_ms, handed = handed, unmarked = unmarked,
  marked = marked, permit = permit,
}
local granted = hand_over(keys, args, hold_mark, free_key)
if granted then return granted end
free_key()
if always == '1' then redis.call(publish, channel, token) end
return 1
