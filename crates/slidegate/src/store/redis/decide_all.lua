-- slidegate decide_all: several limits of one identity, all or nothing, in one call.
-- KEYS[i]  the state key of limit i; all share the identity's hash tag
-- ARGV[1]  little-endian doubles: now in ms since the epoch or -1 to take
--          Redis TIME, then four per limit i, in KEYS order: algorithm
--          number (its place in the `algorithms` table below, from 1),
--          limit, window in ms, cost (0 ≤ cost ≤ limit); then, optionally,
--          the caller's deadline in ms on Redis's clock (see the prelude),
--          told by the length: 16 + 32 n bytes rather than 8 + 32 n
-- ARGV[#ARGV]  packed layout only: 8 bytes per limit, in KEYS order: the
--          field of the limit's identity in its window hashes (KEYS[i] is
--          then the stem of the bucket's window hashes)
-- Reply    four little-endian doubles per limit, in order: allowed (1|0),
--          remaining, reset_after ms, retry_after ms (-1 when allowed).
--          Past the deadline: the error EXPIRED <Redis ms>, nothing written.
-- Every limit is checked before any is charged. If one denies, nothing is
-- written and the limits that had room report their state without this
-- request (a cost-0 peek).
local args = ARGV[1]
local now, next_arg = struct.unpack('<d', args)
local deadline = -1
if #args % 32 == 16 then
  deadline = struct.unpack('<d', args, #args - 7)
end
--! include prelude.lua
--! packed local field, fields, window_key = nil, ARGV[#ARGV], nil
--! algorithms

-- Per limit: algorithm, limit, w, cost, the loaded state s1..s3, then
-- everything decide returned (allowed, remaining, reset, retry, new state).
local checked, denied = {}, false
for i = 1, #KEYS do
  local number, limit, w, cost
  number, limit, w, cost, next_arg = struct_unpack('<dddd', args, next_arg)
  local algorithm = algorithms[number]
  if not algorithm then
    return redis.error_reply('slidegate: unknown algorithm number ' .. tostring(number))
  end
  --! packed field = string.sub(fields, 8 * i - 7, 8 * i)
  local s1, s2, s3 = algorithm.load(KEYS[i], limit, w)
  local c = { algorithm, limit, w, cost, s1, s2, s3, algorithm.decide(cost, limit, w, s1, s2, s3) }
  denied = denied or not c[8]
  checked[i] = c
end

local reply = {}
for i, c in ipairs(checked) do
  local algorithm, limit, w, cost, s1, s2, s3 = unpack(c, 1, 7)
  local allowed, remaining, reset, retry, n1, n2, n3, n4 = unpack(c, 8, 15)
  if denied then
    if allowed then
      allowed, remaining, reset, retry = algorithm.decide(0, limit, w, s1, s2, s3)
    end
  elseif cost > 0 then
    --! packed field, window_key = string.sub(fields, 8 * i - 7, 8 * i), nil
    algorithm.commit(KEYS[i], limit, w, cost, n1, n2, n3, n4)
  end
  if client_time then
    algorithm.keep(KEYS[i], w, reset)
  end
  reply[i] = struct_pack('<dddd', allowed and 1 or 0, remaining, reset, retry)
end
return table.concat(reply)
