-- The source article's reference sliding window counter, kept
-- verbatim in behaviour as the baseline that `demo` and `bench redis` compare
-- slidegate against. It is not used to make decisions anywhere else.
--
-- KEYS[1] = identity; ARGV = now (ms), window (ms), limit.
-- Reply: 1 allowed, 0 denied.
local now, win, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local curWin  = math.floor(now / win)
local curKey  = KEYS[1]..":"..curWin
local prevKey = KEYS[1]..":"..(curWin - 1)
local cur  = tonumber(redis.call("GET", curKey)  or "0")
local prev = tonumber(redis.call("GET", prevKey) or "0")
local est  = cur + prev * (1 - (now - curWin*win)/win)
if est < limit then
  redis.call("INCR", curKey)
  redis.call("PEXPIRE", curKey, win*2)
  return 1
end
return 0
