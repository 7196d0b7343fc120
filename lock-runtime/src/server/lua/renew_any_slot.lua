-- RENEW_ANY_SLOT: the renewal of many leases on one Redis Cluster primary (see `scripts.rs`).
local marks = {unmarked = ARGV[1], marked = ARGV[2], shared = ARGV[3], permits = ARGV[4]}
-- Each lease's key, token and ttl follow the marks.
local leases = 4

local out = {}
for i = 1, (#ARGV - leases) / 3 do
  local at = leases + 3 * i
  out[i] = renew_one(ARGV[at - 2], ARGV[at - 1], ARGV[at], marks) or 2
end
return out
