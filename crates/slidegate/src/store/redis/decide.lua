-- slidegate decide, ALGORITHM: one decision, charged only when allowed.
-- KEYS[1]  the identity's state key, <prefix>{<identity>}:TAG:<limit>:<window_ms>
-- ARGV[1]  four little-endian doubles (struct '<dddd'): now in ms since the
--          epoch or -1 to take Redis TIME, limit, window in ms, cost
--          (0 ≤ cost ≤ limit)
-- Reply    four little-endian doubles: allowed (1|0), remaining,
--          reset_after ms, retry_after ms (-1 when allowed)
-- A denial or a cost of 0 writes nothing; an allowed cost sets the key's TTL
-- in the same write.
--! include prelude.lua
--! include ALGORITHM.lua
local load, decide, commit = TAG_load, TAG_decide, TAG_commit

local key = KEYS[1]
local limit, w, cost = struct_unpack('<ddd', args, next_arg)
local allowed, remaining, reset, retry, s1, s2, s3, s4 = decide(cost, limit, w, load(key, limit, w))
if allowed and cost > 0 then
  commit(key, limit, w, cost, s1, s2, s3, s4)
end
return struct_pack('<dddd', allowed and 1 or 0, remaining, reset, retry)
