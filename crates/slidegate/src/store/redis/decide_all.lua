-- slidegate decide_all: several limits of one identity, all or nothing, in one call.
-- KEYS[i]  the state key of limit i; all share the identity's hash tag
-- ARGV[1]  '' to take the time from Redis TIME, else now in ms since the epoch
-- ARGV[4i-2 .. 4i+1]  limit i: algorithm tag (swc|fw|log|tb|gcra), limit,
--          window in ms, cost (0 ≤ cost ≤ limit)
-- Reply    four integers per limit, in order: allowed (1|0), remaining,
--          reset_after ms, retry_after ms (-1 when allowed)
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
  swc = { swc_load, swc_decide, swc_commit },
  fw = { fw_load, fw_decide, fw_commit },
  log = { log_load, log_decide, log_commit },
  tb = { tb_load, tb_decide, tb_commit },
  gcra = { gcra_load, gcra_decide, gcra_commit },
}

local checked, denied = {}, false
for i = 1, #KEYS do
  local a = 4 * i - 2
  local algorithm = algorithms[ARGV[a]]
  if not algorithm then
    return redis.error_reply('slidegate: unknown algorithm tag ' .. tostring(ARGV[a]))
  end
  local limit, w, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local s1, s2, s3 = algorithm[1](KEYS[i], w)
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
    algorithm[3](KEYS[i], limit, w, cost, d[5], d[6], d[7])
  end
  local r = 4 * i - 3
  reply[r] = d[1] and 1 or 0
  reply[r + 1], reply[r + 2], reply[r + 3] = d[2], d[3], d[4]
end
return reply
