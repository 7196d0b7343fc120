-- A lock with `permits = N`: N permit keys, and the lock's key that holds the permits' mark
-- while any of them is held.

-- Frees the lock's key `mark_key` of its permits' mark (`permits_mark` and N) once none of the
-- `permits` keys exists: the last permit out.
local function free_mark(mark_key, permits, permits_mark)
  for _, permit in ipairs(permits) do
    if redis.call('EXISTS', permit) == 1 then return end
  end
  if starts_with(redis.pcall('GET', mark_key), permits_mark) then
    redis.call('DEL', mark_key)
  end
end
