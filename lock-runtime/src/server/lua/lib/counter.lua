-- The fence counter.

-- Why the counter's `GET` (by `pcall`) `last` cannot give the next fence (another type, not an
-- integer, or at the largest fence, 2^53 - 1, the largest integer a Lua number holds exactly);
-- nil when it can.
local function unusable(last)
  if type(last) == 'table' then return 'holds a value of another type, not an integer counter' end
  if not last then return nil end
  local n = tonumber(last)
  if not n or n < 0 or n ~= math.floor(n) then
    return 'holds ' .. last .. ', not an integer counter'
  end
  if n >= 9007199254740991 then
    return 'is at ' .. last .. ', at or above the largest fence (2^53 - 1): fences cannot go higher'
  end
end

-- Writes `fence` (a string) to `counter`, kept `retention_ms` ('0': forever).
local function write_counter(counter, fence, retention_ms)
  if retention_ms ~= '0' then
    redis.call('SET', counter, fence, 'PX', retention_ms)
  else
    redis.call('SET', counter, fence)
  end
end

-- Records `record` (a fence, as a string) in `counter` for a release: only ever raised, and only
-- on a counter (a value no script wrote stays as it is).
local function raise_counter(counter, record, retention_ms)
  local last = redis.pcall('GET', counter)
  if type(last) == 'table' then return end
  last = tonumber(last or 0)
  if last and last >= 0 and last % 1 == 0 and last < tonumber(record) then
    write_counter(counter, record, retention_ms)
  end
end

-- The next fence, `max(last + 1, floor)`, written to `counter`: `last` is the counter's `GET`
-- (checked by `unusable`), the floor the server's clock in µs rounded down to `quantum` µs
-- (except in the second of a restart or save, see `ACQUIRE`). Returns the fence and the
-- server's `TIME`.
local function next_fence(counter, last, quantum, retention_ms)
  last = tonumber(last) or 0
  local t = redis.call('TIME')
  local s = tonumber(t[1])
  local now = s * 1000000 + tonumber(t[2])
  quantum = tonumber(quantum)
  if quantum > 1 and redis.call('LASTSAVE') < s then now = now - now % quantum end
  local fence = math.max(last + 1, now)
  write_counter(counter, string.format('%d', fence), retention_ms)
  return fence, t
end
