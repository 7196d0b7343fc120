-- The marks a value can carry, each passed by the caller (the names live in `model/keys.rs`).

-- Whether `value` is a string that begins with `prefix`.
local function starts_with(value, prefix)
  return type(value) == 'string' and string.sub(value, 1, #prefix) == prefix
end

-- Whether `value` is a string that ends with `suffix`.
local function ends_with(value, suffix)
  return type(value) == 'string' and #value >= #suffix
    and string.sub(value, #value - #suffix + 1) == suffix
end

-- `value` with the waiters' mark set (its last field `unmarked` written as `marked`); nil for a
-- value without that field (another client's, for one), which is never changed.
local function with_mark(value, unmarked, marked)
  if ends_with(value, unmarked) then
    return string.sub(value, 1, #value - #unmarked) .. marked
  end
end

-- Whether `value` (a key's `GET`) is the lease's `token`, as written or with the waiters' mark
-- set.
local function is_ours(value, token, unmarked, marked)
  return value == token or (type(value) == 'string' and value == with_mark(token, unmarked, marked))
end

-- Sets the waiters' mark of the value `cur` of `key` in place (the key keeps its expiry), so
-- that its holder's release hands the lock over; a value without the field stays as it is.
local function mark_in_place(key, cur, unmarked, marked)
  if ends_with(cur, unmarked) then
    redis.call('SETRANGE', key, #cur - #unmarked, marked)
  end
end
