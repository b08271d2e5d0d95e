-- GCRA, mirroring algorithm/gcra.rs. Its load / decide / commit sections
-- follow the contract in scripts.rs.
-- State: one string key, struct '<I6I7' = the theoretical arrival time (TAT)
-- as whole ms since the epoch (48 bits hold every time the stores accept)
-- and the rest in ticks of 1/limit ms (below the limit, at most 2^50).
-- Time ahead of now is counted in ticks, where the emission interval is
-- exactly w ticks and the horizon limit × w ≤ 2^53.
--! state s_tat, s_frac
--! charged settled

--! load
s_tat, s_frac = 0, 0
local v = call('GET', key)
if v then
  if #v == 13 then
    s_tat, s_frac = struct_unpack('<I6I7', v)
  else
    -- The layout before exact ticks: the TAT in µs as an integer. Rounded
    -- up to whole ms, it never lies earlier than it did.
    local us = tonumber(v)
    if us then
      local r = fmod(us, 1000)
      s_tat = (us - r) / 1000
      if r > 0 then
        s_tat = s_tat + 1
      end
    end
  end
end

--! decide
-- Decides, and gives the TAT in ticks ahead of now after charging.
local horizon = limit * w
local ahead, frac = 0, 0
if s_tat >= now then
  ahead, frac = s_tat - now, s_frac
end
-- Ticks ahead of now, when within the horizon (-1 past it: only a clock
-- that stepped back leaves it there, where the product could pass 2^53).
local ticks = -1
if ahead < w or (ahead == w and frac == 0) then
  ticks = ahead * limit + frac
end
-- cost × w ≤ horizon − ticks rather than the sum, which could pass 2^53.
local room = horizon - cost * w
allowed = ticks >= 0 and ticks <= room
settled, remaining, reset, retry = ticks, 0, 0, -1
if allowed then
  settled = ticks + cost * w
end
if settled >= 0 then
  -- ⌊(horizon − settled) / W⌋ and ⌈settled / limit⌉
  local left = horizon - settled
  remaining = (left - fmod(left, w)) / w
  local r = fmod(settled, limit)
  reset = (settled - r) / limit
  if r > 0 then
    reset = reset + 1
  end
else
  reset = ahead
  if frac > 0 then
    reset = reset + 1
  end
end
if not allowed then
  -- ⌈(ticks − room) / limit⌉, split so that no term passes 2^53.
  if room >= frac then
    local a = room - frac
    retry = ahead - (a - fmod(a, limit)) / limit
  else
    retry = ahead + 1
  end
end

--! commit
-- The state stops mattering once now reaches the TAT.
local frac = fmod(settled, limit)
local tat = now + (settled - frac) / limit
local idle_at = tat
if frac > 0 then
  idle_at = tat + 1
end
call('SET', key, struct_pack('<I6I7', tat, frac), expire_how, format('%d', idle_at - expire_from))
