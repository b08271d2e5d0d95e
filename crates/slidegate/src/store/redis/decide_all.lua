-- slidegate decide_all: several limits of one identity, all or nothing, in one call.
-- KEYS[i]  the state key of limit i; all share the identity's hash tag
-- ARGV[1]  little-endian doubles: now in ms since the epoch or -1 to take
--          Redis TIME, then four per limit i, in KEYS order: algorithm
--          (1 sliding window counter, 2 fixed window, 3 sliding log,
--          4 token bucket, 5 gcra), limit, window in ms, cost (0 ≤ cost ≤ limit)
-- Reply    four little-endian doubles per limit, in order: allowed (1|0),
--          remaining, reset_after ms, retry_after ms (-1 when allowed)
-- Every limit is checked before any is charged. If one denies, nothing is
-- written and the limits that had room report their state without this
-- request (a cost-0 peek).
--! include prelude.lua
--! include sliding_window_counter.lua
--! include fixed_window.lua
--! include sliding_log.lua
--! include token_bucket.lua
--! include gcra.lua

local algorithms = {
  { swc_load, swc_decide, swc_commit },
  { fw_load, fw_decide, fw_commit },
  { log_load, log_decide, log_commit },
  { tb_load, tb_decide, tb_commit },
  { gcra_load, gcra_decide, gcra_commit },
}

local checked, denied = {}, false
for i = 1, #KEYS do
  local number, limit, w, cost
  number, limit, w, cost, next_arg = struct_unpack('<dddd', args, next_arg)
  local algorithm = algorithms[number]
  if not algorithm then
    return redis.error_reply('slidegate: unknown algorithm number ' .. tostring(number))
  end
  local s1, s2, s3 = algorithm[1](KEYS[i], limit, w)
  local d = { algorithm[2](cost, limit, w, s1, s2, s3) }
  denied = denied or not d[1]
  checked[i] = { algorithm, limit, w, cost, s1, s2, s3, d }
end

local reply = {}
for i, c in ipairs(checked) do
  local algorithm, limit, w, cost, d = c[1], c[2], c[3], c[4], c[8]
  if denied then
    if d[1] then
      d = { algorithm[2](0, limit, w, c[5], c[6], c[7]) }
    end
  elseif cost > 0 then
    algorithm[3](KEYS[i], limit, w, cost, d[5], d[6], d[7], d[8])
  end
  reply[i] = struct_pack('<dddd', d[1] and 1 or 0, d[2], d[3], d[4])
end
return table.concat(reply)
