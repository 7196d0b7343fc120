-- RELEASE, its common case first (see `scripts.rs`): a lock's key (no permit's) that holds the
-- token unmarked, with nothing to keep, publish always or look at: the fence to record, then
-- `DEL`. Taken before the shared functions are made, which the common release does not need;
-- any other release goes on to `release.lua`, which decides everything again.
local lock, counter, mark_key = KEYS[1], KEYS[4], KEYS[5]
local token, retention_ms, record = ARGV[1], ARGV[2], ARGV[3]
local keep_ms, always, look = ARGV[5], ARGV[6], ARGV[7]

if not mark_key and keep_ms == '0' and always == '0' and look == '0'
    and redis.pcall('GET', lock) == token then
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
end
