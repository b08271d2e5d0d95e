-- GCRA, mirroring algorithm/gcra.rs. Its load /
-- decide / commit functions follow the contract in scripts.rs.
-- State: one string key, struct '<I6I7' = the theoretical arrival time (TAT)
-- as whole ms since the epoch (48 bits hold every time the stores accept)
-- and the rest in ticks of 1/limit ms (below the limit, at most 2^50).
-- Time ahead of now is counted in ticks, where the emission interval is
-- exactly w ticks and the horizon limit × w ≤ 2^53.

local function gcra_load(key, limit, w)
  local v = call('GET', key)
  if v then
    if #v == 13 then
      local tat, frac = struct_unpack('<I6I7', v)
      return tat, frac
    end
    -- The layout before exact ticks: the TAT in µs as an integer. Rounded
    -- up to whole ms, it never lies earlier than it did.
    local us = tonumber(v)
    if us then
      return div_ceil(us, 1000), 0
    end
  end
  return 0, 0
end

-- -> the decision, then the TAT in ticks ahead of now after charging
local function gcra_decide(cost, limit, w, s_tat, s_frac)
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
  local allowed = ticks >= 0 and ticks <= room
  local settled, remaining, reset, retry = ticks, 0, 0, -1
  if allowed then
    settled = ticks + cost * w
  end
  if settled >= 0 then
    remaining = div_floor(horizon - settled, w)
    reset = div_ceil(settled, limit)
  else
    reset = ahead
    if frac > 0 then
      reset = reset + 1
    end
  end
  if not allowed then
    -- ⌈(ticks − room) / limit⌉, split so that no term passes 2^53.
    if room >= frac then
      retry = ahead - div_floor(room - frac, limit)
    else
      retry = ahead + 1
    end
  end
  return allowed, remaining, reset, retry, settled
end

-- The state stops mattering once now reaches the TAT.
local function gcra_commit(key, limit, w, cost, settled)
  local frac = fmod(settled, limit)
  local tat = now + (settled - frac) / limit
  local idle_at = tat
  if frac > 0 then
    idle_at = tat + 1
  end
  call('SET', key, struct_pack('<I6I7', tat, frac), expiry(idle_at))
end
