-- slidegate decide_penalized: decide_all.lua inside the identity's penalty box.
-- KEYS     decide_all.lua's state keys, then one more in the identity's slot:
--          the penalty hash <prefix>{identity}:penalty with fields d (denials
--          in the window), du (when the window ends), b (when the block
--          ends), s (blocks in a row), su (when s is forgotten), all in ms
-- ARGV[1]  as decide_all.lua
-- ARGV[2]  four little-endian doubles: after, within ms, block ms, max_block ms
-- Reply    a blocked identity: one double, the block's remaining ms; its
--          limits are not decided. Otherwise decide_all.lua's reply, then one
--          double: the block this denial started in ms, or -1.
-- The arithmetic mirrors PenaltyState in penalty.rs. The assembler splices
-- this file's three parts into decide_all.lua, so the limits are decided by
-- the very code decide_all runs.
--! part head
local penalty_key = KEYS[#KEYS]
local p_after, p_within, p_block, p_max = struct_unpack('<dddd', ARGV[2])
local p = call('HMGET', penalty_key, 'd', 'du', 'b', 's', 'su')
local p_d, p_du, p_b = tonumber(p[1]) or 0, tonumber(p[2]) or 0, tonumber(p[3]) or 0
local p_s, p_su = tonumber(p[4]) or 0, tonumber(p[5]) or 0
if p_b > now then
  return struct_pack('<d', p_b - now)
end
--! part limits
#KEYS - 1
--! part tail
local blocked = -1
if denied then
  if p_du <= now then
    p_d, p_du = 0, now + p_within
  end
  p_d = p_d + 1
  if p_d > p_after then
    if p_su <= now then
      p_s = 0
    end
    p_s = p_s + 1
    local d = p_block
    for _ = 2, p_s do
      if d >= p_max then
        break
      end
      d = d * 2
    end
    if d > p_max then
      d = p_max
    end
    p_b, p_su, p_d, p_du = now + d, now + d + p_max, 0, 0
    blocked = d
  end
  -- One write and its expiry in the same script: the hash lives as long as
  -- its longest time matters (plus the client-time slack).
  local ttl = math.max(p_du, p_b, p_su) - now
  if client_time then
    ttl = ttl + CLIENT_TTL_SLACK_MS
  end
  call('HSET', penalty_key, 'd', p_d, 'du', p_du, 'b', p_b, 's', p_s, 'su', p_su)
  call('PEXPIRE', penalty_key, ttl)
end
return table.concat(reply) .. struct_pack('<d', blocked)
