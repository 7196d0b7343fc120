-- The renewal of one lease: 1 renewed, 0 not ours (nothing touched), nil when the key is not
-- served here (an error other than a wrong type: on Redis Cluster, a slot that moved).
-- `marks`: the waiters' mark (`unmarked`, `marked`) and the marks of a value that every holder
-- of a shared hold or of permits renews (`shared`, `permits`): such a value is only ever
-- extended, as its holders may have leases of different lengths. A sorted set is a set of
-- shared holders (see `ACQUIRE_SHARED`), each scored by its own expiry on the server's clock
-- (ms): renewing one moves that expiry, unless it has passed.
local function renew_one(key, token, ttl_ms, marks)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' then
    if not string.find(value.err or '', 'WRONGTYPE', 1, true) then return nil end
    local at = redis.pcall('ZSCORE', key, token)
    if type(at) ~= 'string' then return 0 end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if tonumber(at) <= now then return 0 end
    redis.call('ZADD', key, 'XX', now + tonumber(ttl_ms), token)
    if redis.call('PTTL', key) < tonumber(ttl_ms) then redis.call('PEXPIRE', key, ttl_ms) end
    return 1
  end
  if not is_ours(value, token, marks.unmarked, marks.marked) then return 0 end
  local many = starts_with(value, marks.shared) or starts_with(value, marks.permits)
  if not many or redis.call('PTTL', key) < tonumber(ttl_ms) then
    redis.call('PEXPIRE', key, ttl_ms)
  end
  return 1
end
