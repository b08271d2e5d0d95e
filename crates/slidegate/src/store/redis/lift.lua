-- slidegate lift: forgets an identity's penalty box (its block, denials
-- and strikes), answering how long the block had left.
-- KEYS[1]  the penalty hash <prefix>{identity}:penalty (penalty.lua's)
-- ARGV[1]  now in ms, or -1 to read Redis TIME
-- ARGV[2]  the caller's deadline in ms on Redis's clock, or -1; a call
--          reached after it deletes nothing and answers the error
--          EXPIRED <Redis ms>
-- Reply    the ms the block had left, or -1 when it was not blocked
local call = redis.call
local now = tonumber(ARGV[1])
local deadline = tonumber(ARGV[2])
--! include deadline.lua
local b = tonumber(call('HGET', KEYS[1], 'b')) or 0
call('DEL', KEYS[1])
if b > now then
  return b - now
end
return -1
