-- RELEASE_SHORT: the common release (see `scripts.rs`). The lock's key holds the token as it was
-- written, with no waiter's mark: the fence to record, then `DEL`. Any other value is left to
-- `RELEASE`, which decides every case. Without a fence to record, the call sends only the key
-- and the token.
local lock, counter = KEYS[1], KEYS[2]
local token, retention_ms, record = ARGV[1], ARGV[2], ARGV[3] or '0'

if redis.pcall('GET', lock) ~= token then
  return 0
end
-- Only ever raised, and only on a counter (a value this script did not write stays as it is).
if record ~= '0' then
  local last = redis.pcall('GET', counter)
  if type(last) ~= 'table' then
    last = tonumber(last or 0)
    if last and last >= 0 and last % 1 == 0 and last < tonumber(record) then
      if retention_ms ~= '0' then
        redis.call('SET', counter, record, 'PX', retention_ms)
      else
        redis.call('SET', counter, record)
      end
    end
  end
end
redis.call('DEL', lock)
return 1
