-- RENEW: the renewal of the leases whose keys are KEYS (see `scripts.rs`).
local marks = {unmarked = ARGV[1], marked = ARGV[2], shared = ARGV[3], permits = ARGV[4]}
-- Each lease's token and ttl follow the marks.
local leases = 4

local out = {}
for i, key in ipairs(KEYS) do
  local at = leases + 2 * i
  out[i] = renew_one(key, ARGV[at - 1], ARGV[at], marks) or 0
end
return out
