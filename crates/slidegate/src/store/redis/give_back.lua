-- slidegate give_back: undoes a lease's unused permits in the window it was
-- charged in (store/lease.rs, GivesBack, is the arithmetic mirrored here).
-- KEYS[1]  the identity's state key, as lease.lua's
-- ARGV[1]  1 for a sliding window counter, 2 for a fixed window
-- ARGV[2]  the limit (the value's layout depends on it)
-- ARGV[3]  the window the lease was charged in, modulo 2^32 (lease.lua's)
-- ARGV[4]  the permits to give back
-- ARGV[5]  the caller's deadline in ms on Redis's clock, or -1; a call
--          reached after it writes nothing and answers the error
--          EXPIRED <Redis ms>
-- Reply    how many permits were given back: at most the count charged in
--          that window, 0 once the window no longer counts or the key is
--          gone. The value is rewritten in place (SETRANGE, same length),
--          so the key keeps its TTL; a missing key is never created.
local call = redis.call
local kind, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, unused = tonumber(ARGV[3]), tonumber(ARGV[4])
local deadline = tonumber(ARGV[5])
local now = 0 -- no clock of its own: the deadline alone reads TIME
--! include deadline.lua
local v = call('GET', KEYS[1])
if not v then
  return 0
end
local TWO_32 = 4294967296
local wide = limit >= TWO_32
local back = 0
if kind == 1 then
  local layout = wide and '<I4dd' or '<I4I4I4'
  local s_window, cur, prev = struct.unpack(layout, v)
  if s_window == window then
    back = math.min(unused, cur)
    cur = cur - back
  elseif s_window == (window + 1) % TWO_32 then
    back = math.min(unused, prev)
    prev = prev - back
  end
  if back > 0 then
    call('SETRANGE', KEYS[1], '0', struct.pack(layout, s_window, cur, prev))
  end
else
  local layout = wide and '<I4d' or '<I4I4'
  local s_window, count = struct.unpack(layout, v)
  if s_window == window then
    back = math.min(unused, count)
    count = count - back
  end
  if back > 0 then
    call('SETRANGE', KEYS[1], '0', struct.pack(layout, s_window, count))
  end
end
return back
