-- slidegate give_back, packed layout: undoes a lease's unused permits in
-- the window it was charged in, as give_back.lua does in the per-key
-- layout (store/lease.rs, GivesBack, is the arithmetic mirrored here).
-- KEYS[1]  the stem of the identity's bucket's window hashes, as lease.lua's
-- ARGV[1]  1 for a sliding window counter, 2 for a fixed window
-- ARGV[2]  the limit (the value's layout depends on it)
-- ARGV[3]  the window the lease was charged in, its number in full (lease.lua's)
-- ARGV[4]  the permits to give back
-- ARGV[5]  the caller's deadline in ms on Redis's clock, or -1; a call
--          reached after it writes nothing and answers the error
--          EXPIRED <Redis ms>
-- ARGV[6]  the identity's field in the window hashes
-- Reply    how many permits were given back: at most the count charged in
--          that window, 0 once the window no longer counts or its hash is
--          gone. A missing hash or field is never created, so every hash
--          keeps the TTL its first write gave it.
-- A sliding window counter's count of window n is also carried, as prev,
-- into window n + 1's value once the identity counted there: both go down
-- together, the later one deciding how much there is to give back (as the
-- per-key state, which holds only the later window). Once the identity
-- counts in a window where window n no longer counts (n + 1 for a fixed
-- window, n + 2 for the counter), nothing is given back, as the per-key
-- state, which no longer holds window n, gives nothing.
local call = redis.call
local kind, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, unused = tonumber(ARGV[3]), tonumber(ARGV[4])
local deadline = tonumber(ARGV[5])
local field = ARGV[6]
local now = 0 -- no clock of its own: the deadline alone reads TIME
--! include deadline.lua
local format = string.format
local this_key = KEYS[1] .. format('%d', window)
local v = call('HGET', this_key, field)
if not v then
  return 0
end
if kind == 2 then
  if call('HEXISTS', KEYS[1] .. format('%d', window + 1), field) == 1 then
    return 0
  end
  local back = math.min(unused, v + 0)
  if back > 0 then
    call('HINCRBY', this_key, field, format('%d', -back))
  end
  return back
end
local TWO_26 = 67108864
local wide = limit >= TWO_26
-- (cur, prev) of a value.
local function counts(value)
  if wide then
    return struct.unpack('<dd', value)
  end
  value = value + 0
  local cur = value % (limit + 1)
  return cur, (value - cur) / (limit + 1)
end
if call('HEXISTS', KEYS[1] .. format('%d', window + 2), field) == 1 then
  return 0
end
local next_key = KEYS[1] .. format('%d', window + 1)
local later = call('HGET', next_key, field)
local back = 0
if later then
  local cur, prev = counts(later)
  back = math.min(unused, prev)
  if back > 0 then
    if wide then
      call('HSET', next_key, field, struct.pack('<dd', cur, prev - back))
    else
      call('HINCRBY', next_key, field, format('%d', -back * (limit + 1)))
    end
  end
else
  back = math.min(unused, (counts(v)))
end
if back > 0 then
  local cur, prev = counts(v)
  local less = math.min(back, cur)
  if wide then
    call('HSET', this_key, field, struct.pack('<dd', cur - less, prev))
  else
    call('HINCRBY', this_key, field, format('%d', -less))
  end
end
return back
