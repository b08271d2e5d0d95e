-- slidegate prelude: arguments, the clock and exact integer division. Every
-- script starts with this file; the algorithm files and one main follow it.
--
-- ARGV[1] is binary: little-endian doubles (struct format '<d'), the first
-- being now in ms since the Unix epoch, or -1 to read Redis TIME (the
-- default: one clock for every app server). The main script reads the rest
-- from `args` at `next_arg`. Doubles hold every integer up to 2^53 exactly,
-- and decoding them costs far less than tonumber on decimal strings.
--
-- Lua 5.1 numbers are doubles. Quota keeps limit × window_ms ≤ 2^53 and the
-- algorithms are written so every sum and product stays below that bound,
-- where + − × on integers are exact. Division goes through div_floor /
-- div_ceil, which are exact too (math.fmod is exact in IEEE arithmetic, and
-- a multiple of b divided by b is exact). `%` (a − floor(a / b) × b) is
-- exact as well when 0 ≤ a < 2^53 and b ≥ 1 are integers: a quotient that is
-- not an integer lies at least 1/b below the next one, more than half an
-- ulp of a/b while a < 2^53, so the rounded a / b never reaches it. The hot
-- paths use `%` on such operands: an operator, where fmod is a C call.
--
-- Numbers handed to redis.call are formatted by Redis itself ("%.17g" on
-- 7.0, integer printing on later versions): exact for integers below 1e17.
local call = redis.call
local fmod = math.fmod
local struct_pack, struct_unpack = struct.pack, struct.unpack

local args = ARGV[1]
local now, next_arg = struct_unpack('<d', args)
local client_time = now >= 0
if not client_time then
  local t = call('TIME')
  local us = tonumber(t[2])
  now = tonumber(t[1]) * 1000 + (us - us % 1000) / 1000
end

-- In client time a key's TTL runs on Redis's clock from the write, while the
-- state ages on the client's clock; the slack keeps a key alive while a slow
-- (or manual) client clock still needs it. An idle key changes no decision,
-- so living longer is always safe.
local CLIENT_TTL_SLACK_MS = 10000

-- Packed states keep window numbers modulo 2^32 and counts in 32 bits when
-- the limit allows: 12-byte values fit Redis's smallest string allocation.
-- A key lives at most two windows (plus the client-time slack), far less
-- than 2^32 windows, so a window number modulo 2^32 never aliases.
local TWO_32, TWO_48 = 4294967296, 281474976710656

local function div_floor(a, b)
  return (a - fmod(a, b)) / b
end

local function div_ceil(a, b)
  local r = fmod(a, b)
  if r == 0 then
    return a / b
  end
  return (a - r) / b + 1
end

-- How far now lies before the start of the state's window s_window (0 when
-- it does not), mirroring algorithm::skew_ms: a clock that stepped back
-- decides as at the start of the state's own window. Window numbers are kept
-- modulo 2^32; a state "ahead" by 2^31 windows or more is taken as behind
-- (Redis expires window states after two windows, so only a clock step of
-- that size could be misread).
local function window_skew(s_window, window, elapsed, w)
  if s_window < 0 then
    return 0
  end
  local ahead = (s_window - window + TWO_32) % TWO_32
  if ahead > 0 and ahead < TWO_32 / 2 then
    return ahead * w - elapsed
  end
  return 0
end

-- The expiry arguments for a state that stops mattering at idle_at (ms).
local function expiry(idle_at)
  if client_time then
    return 'PX', idle_at - now + CLIENT_TTL_SLACK_MS
  end
  return 'PXAT', idle_at
end
