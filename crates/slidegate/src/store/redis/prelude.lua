-- slidegate prelude: the clock, expiry and the rules of exact arithmetic.
-- Every script includes it right after decoding `now` from ARGV[1]
-- (little-endian doubles, struct format '<d'): ms since the Unix epoch, or
-- -1 to read Redis TIME (the default: one clock for every app server).
-- Doubles hold every integer up to 2^53 exactly, and decoding them costs far
-- less than tonumber on decimal strings.
--
-- The prelude defines no function, nor does any algorithm file: Redis runs a
-- script's chunk anew on every call, and each `local function` in it would
-- be a new closure, allocated and later collected, every time.
--
-- Lua 5.1 numbers are doubles. Quota keeps limit × window_ms ≤ 2^53 and the
-- algorithms are written so every sum and product stays below that bound,
-- where + − × on integers are exact. `%` (a − floor(a / b) × b) is exact
-- when 0 ≤ a < 2^53 and b ≥ 1 are integers: a quotient that is not an
-- integer lies at least 1/b below the next one, more than half an ulp of
-- a/b while a < 2^53, so the rounded a / b never reaches it. Then
-- ⌊a / b⌋ = (a − a % b) / b exactly (a multiple of b divided by b is exact),
-- and ⌈a / b⌉ is that plus one when a % b > 0. Where an operand may reach
-- 2^53 itself, math.fmod (exact in IEEE arithmetic) takes the place of `%`.
--
-- Numbers handed to redis.call are formatted by Redis with "%.17g" (on 7.0;
-- exact for integers below 1e17, and about 2,000 instructions each). The hot
-- paths hand it strings instead: constants, or string.format('%d', n) for
-- integers below 2^53, which formats an integer and costs a fraction.
local call = redis.call
local struct_pack, struct_unpack = struct.pack, struct.unpack
local fmod = math.fmod
local format = string.format

local client_time = now >= 0
if not client_time then
  local t = call('TIME')
  -- Arithmetic converts the two strings, cheaper than calls of tonumber.
  local us = t[2] + 0
  now = t[1] * 1000 + (us - us % 1000) / 1000
end

-- The caller's deadline (ms on Redis's clock; -1: none), set by the main
-- script from ARGV[1]. A call Redis reaches after it (queued behind a stall,
-- a stopped server) was counted as failed by the caller: it must charge
-- nothing, so it is refused before any read or write, with the server's
-- time, which the caller learns its clock offset from.
if deadline >= 0 then
  local server_now = now
  if client_time then
    local t = call('TIME')
    local us = t[2] + 0
    server_now = t[1] * 1000 + (us - us % 1000) / 1000
  end
  if server_now > deadline then
    return redis.error_reply(format('EXPIRED %d', server_now))
  end
end

-- In client time a key's TTL runs on Redis's clock from the write, while the
-- state ages on the client's clock; the slack keeps a key alive while a slow
-- (or manual) client clock still needs it. An idle key changes no decision,
-- so living longer is always safe. A state that stops mattering at idle_at
-- (ms) expires with `expire_how, idle_at - expire_from`: PXAT idle_at on the
-- server's clock, PX (idle_at − now + slack) on the client's. A client clock
-- that steps back makes a state matter longer than the TTL its last write
-- set: after every decision in client time, charged or refused, the
-- algorithm's keep section sets the TTL to cover it and the slack, no more
-- (scripts.rs, KEEP).
-- A key written whole takes `SET … expire_how`, one given its expiry
-- apart takes the command `expire_key`.
local CLIENT_TTL_SLACK_MS = 10000
local expire_how, expire_key, expire_from = 'PXAT', 'PEXPIREAT', 0
if client_time then
  expire_how, expire_key, expire_from = 'PX', 'PEXPIRE', now - CLIENT_TTL_SLACK_MS
end

-- Packed states keep window numbers modulo 2^32 and counts in 32 bits when
-- the limit allows: 12-byte values fit Redis's smallest string allocation.
-- A key lives at most two windows (plus the client-time slack), far less
-- than 2^32 windows, so a window number modulo 2^32 never aliases. A state
-- whose window lies "ahead" of now's by less than 2^31 windows is one a
-- clock that stepped back left behind (mirroring algorithm::skew_ms); one
-- ahead by more is taken as behind (Redis expires window states after two
-- windows, so only a clock step of that size could be misread).
local TWO_32, TWO_48 = 4294967296, 281474976710656
-- The packed layout keeps a sliding window counter's two counts in one
-- integer below limits of 2^26 (layout.rs).
local TWO_26 = 67108864
