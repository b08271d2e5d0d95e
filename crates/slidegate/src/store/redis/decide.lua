-- slidegate decide, ALGORITHM: one decision, charged only when allowed.
-- KEYS[1]  the identity's state key, <prefix>{<identity>}:TAG:<limit>:<window_ms>
-- ARGV[1]  '' to take the time from Redis TIME, else now in ms since the epoch
-- ARGV[2]  limit, ARGV[3] window in ms, ARGV[4] cost (0 ≤ cost ≤ limit)
-- Reply    {allowed (1|0), remaining, reset_after ms, retry_after ms (-1 when allowed)}
-- A denial or a cost of 0 writes nothing; an allowed cost sets the key's TTL
-- in the same write.
--! include prelude.lua
--! include ALGORITHM.lua
local load, decide, commit = TAG_load, TAG_decide, TAG_commit

local key, limit, w, cost = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local allowed, remaining, reset, retry, s1, s2, s3 = decide(cost, limit, w, load(key, w))
if allowed and cost > 0 then
  commit(key, limit, w, cost, s1, s2, s3)
end
if allowed then
  return {1, remaining, reset, retry}
end
return {0, remaining, reset, retry}
