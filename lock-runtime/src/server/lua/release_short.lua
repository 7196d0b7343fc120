-- RELEASE_SHORT: the common release (see `scripts.rs`). The lock's key holds the token as it was
-- written, with no waiter's mark: the fence to record, then `DEL`. Any other value is left to
-- `RELEASE`, which decides every case. Without a fence to record, the call sends only the key
-- and the token.
local lock, counter = KEYS[1], KEYS[2]
local token, retention_ms, record = ARGV[1], ARGV[2], ARGV[3] or '0'

if redis.pcall('GET', lock) ~= token then
  return 0
end
if record ~= '0' then raise_counter(counter, record, retention_ms) end
redis.call('DEL', lock)
return 1
