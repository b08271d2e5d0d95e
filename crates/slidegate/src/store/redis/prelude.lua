-- slidegate prelude: the clock and exact integer division. Every script
-- starts with this file; the algorithm files and one main follow it.
--
-- ARGV[1]: '' to read the time from Redis TIME (the default: one clock for
-- every app server), or now in ms since the Unix epoch (client time).
--
-- Lua 5.1 numbers are doubles. Quota keeps limit × window_ms ≤ 2^53 and the
-- algorithms are written so every sum and product stays below that bound,
-- where + − × on integers are exact. Division goes through div_floor /
-- div_ceil, which are exact too (math.fmod is exact in IEEE arithmetic, and
-- a multiple of b divided by b is exact); `/` alone could round across an
-- integer near 2^53 and `%` is built on it.
--
-- Numbers handed to redis.call are formatted by Redis itself ("%.17g" on
-- 7.0, integer printing on later versions): exact for integers below 1e17.
local call = redis.call
local fmod = math.fmod
local pack_state, unpack_state = struct.pack, struct.unpack

local now, client_time
if ARGV[1] == '' then
  local t = call('TIME')
  now = t[1] * 1000 + (t[2] - fmod(t[2], 1000)) / 1000
else
  now = tonumber(ARGV[1])
  client_time = true
end

-- In client time a key's TTL runs on Redis's clock from the write, while the
-- state ages on the client's clock; the slack keeps a key alive while a slow
-- (or manual) client clock still needs it. An idle key changes no decision,
-- so living longer is always safe.
local CLIENT_TTL_SLACK_MS = 10000

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

-- The expiry arguments for a state that stops mattering at idle_at (ms).
local function expiry(idle_at)
  if client_time then
    return 'PX', idle_at - now + CLIENT_TTL_SLACK_MS
  end
  return 'PXAT', idle_at
end
