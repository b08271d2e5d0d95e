-- slidegate distinct: admits one value among the distinct values an identity
-- touches per window, counted with Redis's HyperLogLog (PFADD / PFCOUNT).
-- Mirrors crate::distinct::decide: a value is admitted when the sketch
-- already holds it (PFADD would change no register) or when the estimate of
-- the values seen so far is below the limit; only an admitted value is added,
-- so a denial writes nothing.
--
-- KEYS[1]  the sketch:          <prefix>{identity}:hll:<limit>:<window_ms>
-- KEYS[2]  its window number:   KEYS[1] .. ':w' (a string)
-- KEYS[3]  scratch, deleted before the script ends: KEYS[1] .. ':tmp'
--          All three share the identity's hash tag, hence one slot.
-- ARGV[1]  now in ms, or -1 to read Redis TIME
-- ARGV[2]  window in ms
-- ARGV[3]  the limit (distinct values per window)
-- ARGV[4]  the value
-- ARGV[5]  TTL slack in ms (10000 in client time, 0 with Redis TIME)
-- ARGV[6]  optional: the caller's deadline in ms on Redis's clock; a call
--          reached after it writes nothing and answers the error
--          EXPIRED <Redis ms> (as the prelude of the other scripts)
-- Reply:   { allowed (0/1), estimate after this request, ms to the window's end }
--
-- Windows are aligned to multiples of window_ms since the epoch, kept in
-- KEYS[2] so that the sketch's key does not depend on a clock the caller
-- cannot read (Redis TIME). Both keys expire at the window's end (plus the
-- slack), set in the write that creates them.
local call = redis.call
local now = tonumber(ARGV[1])
local server_now = -1
if now < 0 or ARGV[6] then
  local t = call('TIME')
  local us = tonumber(t[2])
  server_now = tonumber(t[1]) * 1000 + (us - math.fmod(us, 1000)) / 1000
end
if now < 0 then
  now = server_now
end
if ARGV[6] and server_now > tonumber(ARGV[6]) then
  return redis.error_reply(string.format('EXPIRED %d', server_now))
end
local window_ms = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local value = ARGV[4]
local rest = math.fmod(now, window_ms)
local window = string.format('%d', (now - rest) / window_ms)
local reset_after = window_ms - rest
local ttl = reset_after + tonumber(ARGV[5])

local current = call('GET', KEYS[2]) == window
local count = 0
if current then
  count = call('PFCOUNT', KEYS[1])
end
if count < limit then
  if not current then
    call('DEL', KEYS[1])
    call('SET', KEYS[2], window, 'PX', ttl)
  end
  if call('PFADD', KEYS[1], value) == 1 then
    call('PEXPIRE', KEYS[1], ttl)
    count = call('PFCOUNT', KEYS[1])
  end
  return { 1, count, reset_after }
end
-- At the limit: is the value already counted? PFADD on a copy answers
-- without touching the sketch (a denial writes nothing).
call('COPY', KEYS[1], KEYS[3], 'REPLACE')
local changed = call('PFADD', KEYS[3], value)
call('DEL', KEYS[3])
if changed == 0 then
  return { 1, count, reset_after }
end
return { 0, count, reset_after }
