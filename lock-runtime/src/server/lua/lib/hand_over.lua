-- The hand-over of a released lock to the first live waiter (see `RELEASE`).

-- What follows the last `marker` in `text` when that is one or more letters or digits; nil
-- otherwise.
local function tail_after(text, marker)
  local at, from = nil, 1
  while true do
    local found = string.find(text, marker, from, true)
    if not found then break end
    at, from = found, found + 1
  end
  if not at then return nil end
  local rest = string.sub(text, at + #marker)
  if string.match(rest, '^%w+$') then return rest end
end

-- With waiters queued, grants the lock's key to the first live one and returns the reply (see
-- `RELEASE`); nil when nobody queues. `k`: the keys (`key`, `queue`, `states`, `counter`);
-- `a`: the released `token` (published when the head cannot be granted the lock), the
-- `channel`, the `grant_prefix` of the grant channels, the `grants` mark of a waiter id before
-- its grant channel id, `publish`, the counter's `retention_ms`, the `handed` mark, the waiters'
-- mark (`unmarked`, `marked`) and the `permit` index of a permit's key (empty for a lock's);
-- `hold_mark(ms)` keeps a permit's lock key marked while the permit is handed over, and
-- `free_key()` deletes the key.
local function hand_over(k, a, hold_mark, free_key)
  -- The first two in line: a queue exists if it has a first, and others still queue after the
  -- first if it has a second. A queue name that holds another type (another client's key) is no
  -- queue.
  local line = redis.pcall('ZRANGE', k.queue, 0, 1)
  if line.err then line = {} end
  local head = line[1]
  if not head then return nil end
  local state = redis.call('HGET', k.states, head)
  local nonce, grace = nil, nil
  if state then nonce, grace = string.match(state, '^(%S+) %d+ (%d+)$') end
  local last = redis.pcall('GET', k.counter)
  if unusable(last) then nonce = nil end
  if nonce then
    redis.call('ZREM', k.queue, head)
    redis.call('HDEL', k.states, head)
    local held = nonce
    if line[2] then held = with_mark(nonce, a.unmarked, a.marked) or nonce end
    redis.call('SET', k.key, held, 'PX', grace)
    hold_mark(grace)
    local fence = next_fence(k.counter, last, 1, a.retention_ms)
    local grant = a.handed .. head .. ' ' .. nonce .. ' ' .. string.format('%d', fence)
    -- A permit's key: the grant names the permit.
    if a.permit ~= '' then grant = grant .. ' ' .. a.permit end
    local via = tail_after(head, a.grants)
    redis.call(a.publish, via and a.grant_prefix .. via or a.channel, grant)
    return grant
  end
  if state and string.match(state, '^%S+ %d+$') then
    -- Out of the queue: a second release meanwhile hands its key to the next in line.
    redis.call('ZREM', k.queue, head)
    redis.call('HDEL', k.states, head)
    local by_id = string.match(state, ' (%d+)$')
    redis.call('SET', k.key, a.handed .. head, 'PX', by_id)
    hold_mark(by_id)
    redis.call(a.publish, a.channel, a.handed .. head)
    return a.handed .. head
  end
  free_key()
  redis.call(a.publish, a.channel, a.token)
  return 1
end
