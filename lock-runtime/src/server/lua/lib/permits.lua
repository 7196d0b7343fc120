-- A lock with `permits = N`: N permit keys, and the lock's key that holds the permits' mark
-- while any of them is held.

-- Frees the lock's key `mark_key` of the mark of these N `permits` (`permits_mark` and N) once
-- none of them exists: the last permit out. The mark of another N is its holders', whose permit
-- keys may lie past these: it stays.
local function free_mark(mark_key, permits, permits_mark)
  for _, permit in ipairs(permits) do
    if redis.call('EXISTS', permit) == 1 then return end
  end
  if redis.pcall('GET', mark_key) == permits_mark .. #permits then
    redis.call('DEL', mark_key)
  end
end
