-- GCRA, mirroring algorithm/gcra.rs. Its load /
-- decide / commit functions follow the contract in scripts.rs.
-- State: one integer key, the theoretical arrival time (TAT) in µs.

local function gcra_load(key, limit, w)
  local v = call('GET', key)
  if v then
    return tonumber(v)
  end
  return 0
end

-- -> the decision, then the new TAT
local function gcra_decide(cost, limit, w, s_tat)
  local t = div_ceil(w * 1000, limit)
  local now_us = now * 1000
  local horizon = now_us + limit * t
  local start = s_tat
  if start < now_us then
    start = now_us
  end
  local tat = start + cost * t
  local allowed = tat <= horizon
  local settled, retry = start, -1
  if allowed then
    settled = tat
  else
    retry = div_ceil(tat - horizon, 1000)
  end
  -- Only a clock that stepped back can leave the TAT past the horizon.
  local remaining = 0
  if horizon > settled then
    remaining = div_floor(horizon - settled, t)
  end
  return allowed, remaining, div_ceil(settled - now_us, 1000), retry, tat
end

-- The state stops mattering once now reaches the TAT.
local function gcra_commit(key, limit, w, cost, tat)
  call('SET', key, tat, expiry(div_ceil(tat, 1000)))
end
