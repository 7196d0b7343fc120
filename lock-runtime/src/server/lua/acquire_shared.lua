-- ACQUIRE_SHARED: one attempt at a shared hold of a read-write lock (see `scripts.rs`).
local lock, counter, queue, states, readers = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, ttl_ms, quantum, retention_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local publish, channel = ARGV[5], ARGV[6]
local waiter, grace_ms, evict, seen = ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local handed, unmarked, marked = ARGV[11], ARGV[12], ARGV[13]
local shared_mark, permits_mark = ARGV[14], ARGV[15]

-- A shared waiter's queue state, `<nonce> <grace ms>`; an exclusive one's has a ttl too.
local function shared_state(state)
  return state and string.match(state, '^%S+ %d+$')
end

-- The holders' set is checked first: a new shared hold deletes it, and a `DEL` meets no type.
local refused = foreign(readers, 'zset')
if refused then return refused end

local function attempt()
  evict_stale_head(queue, states, evict, seen, {lock}, handed)
  local cur = redis.pcall('GET', lock)
  if type(cur) == 'table' then return {-1, redis.call('TYPE', lock).ok} end
  -- Held by permits (see `ACQUIRE_PERMIT`): another mode, refused rather than waited for.
  if starts_with(cur, permits_mark) then return {-3, cur} end
  local shared = starts_with(cur, shared_mark)
  local ours = cur and waiter ~= '' and cur == handed .. waiter
  -- Whether an exclusive waiter is queued before this caller; the first one in line. Read only
  -- when the key is free or shared, where they decide: behind an exclusive holder, a waiter joins
  -- the queue without them.
  local ahead, first = false, nil
  if not ours and (not cur or shared) then
    for _, id in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
      if id == waiter then break end
      local state = redis.call('HGET', states, id)
      if state then
        first = first or id
        if not shared_state(state) then ahead = true break end
      else
        redis.call('ZREM', queue, id)
      end
    end
  end
  if ours or ((not cur or shared) and not ahead) then
    local last = redis.pcall('GET', counter)
    local why = unusable(last)
    if why then return {-2, why} end
    -- Out of the queue before the key is written (see `unless_foreign`).
    if waiter ~= '' then leave_queue(queue, states, waiter) end
    if not shared then
      cur = shared_mark .. token
      -- The holders of an earlier shared hold whose key was taken from them (a sorted set: ours).
      redis.call('DEL', readers)
      redis.call('SET', lock, cur, 'PX', ttl_ms)
    elseif redis.call('PTTL', lock) < tonumber(ttl_ms) then
      redis.call('PEXPIRE', lock, ttl_ms)
    end
    local fence, t = next_fence(counter, last, quantum, retention_ms)
    -- This holder's place ends with its own lease (its renewals move it); the places of
    -- holders whose lease ran out (dead ones) go.
    local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local member = token .. ' ' .. string.format('%d', fence)
    redis.call('ZADD', readers, ms + tonumber(ttl_ms), member)
    redis.call('ZREMRANGEBYSCORE', readers, '-inf', ms)
    if redis.call('PTTL', readers) < tonumber(ttl_ms) then redis.call('PEXPIRE', readers, ttl_ms) end
    -- Shared waiters next in line join too: woken.
    local next = redis.call('ZRANGE', queue, 0, 0)[1]
    if next and shared_state(redis.call('HGET', states, next)) then
      redis.call(publish, channel, cur)
    end
    return {1, fence, cur, member}
  end
  if waiter ~= '' then
    join_queue(queue, states, waiter, token .. ' ' .. grace_ms, grace_ms)
    -- Queued behind an exclusive holder: its release hands the lock over.
    if not shared then mark_in_place(lock, cur, unmarked, marked) end
  end
  local other = handed_to_another(cur, states, handed)
  if other then return other end
  if not cur and first then
    return {2, first, redis.call('HGET', states, first)}
  end
  return {0, redis.call('PTTL', lock)}
end

return unless_foreign(attempt, {{queue, 'zset'}, {states, 'hash'}})
