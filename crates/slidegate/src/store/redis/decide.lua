-- slidegate decide, ALGORITHM: one decision, charged only when allowed.
-- KEYS[1]  the identity's state key, <prefix>{<identity>}:TAG:<limit>:<window_ms>
--          (packed layout: the stem of its bucket's window hashes)
-- ARGV[1]  four little-endian doubles (struct '<dddd'): now in ms since the
--          epoch or -1 to take Redis TIME, limit, window in ms, cost
--          (0 ≤ cost ≤ limit); then, optionally, a fifth: the caller's
--          deadline in ms on Redis's clock (see the prelude)
-- ARGV[2]  packed layout only: the identity's field in the window hashes
-- Reply    an allowed decision whose remaining is below 2^21 and reset_after
--          below 2^32 ms: the integer remaining × 2^32 + reset_after. Any
--          other: four little-endian doubles, allowed (1|0), remaining,
--          reset_after ms, retry_after ms (-1 when allowed). Past the
--          deadline: the error EXPIRED <Redis ms>, and nothing written.
-- A denial or a cost of 0 writes nothing (in client time it may set the
-- key's TTL: scripts.rs, KEEP); an allowed cost sets the key's TTL in the
-- same write. The algorithm's sections are inlined, one flat chunk:
-- no function is defined, so none is allocated per call.
local now, limit, w, cost = struct.unpack('<dddd', ARGV[1])
local deadline = -1
if #ARGV[1] == 40 then
  deadline = struct.unpack('<d', ARGV[1], 33)
end
--! include prelude.lua
local key = KEYS[1]
--! packed local field, window_key = ARGV[2], nil
--! inline ALGORITHM.lua

-- An integer reply costs Redis a fraction of a string's.
if allowed and remaining < 2097152 and reset < TWO_32 then
  return remaining * TWO_32 + reset
end
return struct_pack('<dddd', allowed and 1 or 0, remaining, reset, retry)
