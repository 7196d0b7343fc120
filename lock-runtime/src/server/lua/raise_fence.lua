-- RAISE_FENCE: raises the fence counter to a fence a Redlock majority agreed on (see
-- `scripts.rs`).
local counter = KEYS[1]
local fence, retention_ms = ARGV[1], ARGV[2]

local last = redis.pcall('GET', counter)
local why = unusable(last)
if why then return {-2, why} end
if (tonumber(last) or 0) < tonumber(fence) then write_counter(counter, fence, retention_ms) end
return 1
