-- slidegate lease, ALGORITHM: one decision on a lease's permits, charged
-- only when allowed, with the window they were charged in.
-- KEYS[1]  the identity's state key, <prefix>{<identity>}:TAG:<limit>:<window_ms>
--          (packed layout: the stem of its bucket's window hashes)
-- ARGV[1]  as decide.lua's: now in ms since the epoch or -1 to take Redis
--          TIME, limit, window in ms, cost (the lease's permits), then
--          optionally the caller's deadline in ms on Redis's clock
-- ARGV[2]  packed layout only: the identity's field in the window hashes
-- Reply    five little-endian doubles: allowed (1|0), remaining,
--          reset_after ms, retry_after ms (-1 when allowed), and the number
--          of the window charged, modulo 2^32 (the one give_back.lua takes;
--          packed: in full, the one give_back_packed.lua takes).
--          Past the deadline: the error EXPIRED <Redis ms>, nothing written.
-- Only the window algorithms are leased (see store/lease.rs); their
-- sections are inlined as in decide.lua.
local now, limit, w, cost = struct.unpack('<dddd', ARGV[1])
local deadline = -1
if #ARGV[1] == 40 then
  deadline = struct.unpack('<d', ARGV[1], 33)
end
--! include prelude.lua
local key = KEYS[1]
--! packed local field, window_key = ARGV[2], nil
--! inline ALGORITHM.lua

--! per_key return struct_pack('<ddddd', allowed and 1 or 0, remaining, reset, retry, window)
--! packed return struct_pack('<ddddd', allowed and 1 or 0, remaining, reset, retry, (now - now % w) / w)
