-- Token bucket, mirroring algorithm/token_bucket.rs. Its load /
-- decide / commit functions follow the contract in scripts.rs.
-- State: one string key, struct '<I6I6' = used (units of 1/W token missing
-- from a full bucket), last_ms ('<dI6' when limit × W needs more than 48
-- bits; ms since the epoch fit 48 bits until the year 10889). No key is a
-- full bucket.

local function tb_format(limit, w)
  if limit * w < TWO_48 then
    return '<I6I6'
  end
  return '<dI6'
end

local function tb_load(key, limit, w)
  local v = call('GET', key)
  if v then
    local used, last = struct_unpack(tb_format(limit, w), v)
    return used, last
  end
  return 0, 0
end

-- -> the decision, then the new state
local function tb_decide(cost, limit, w, s_used, s_last)
  local capacity = limit * w
  local elapsed = now - s_last
  if elapsed < 0 then
    elapsed = 0
  elseif elapsed > w then
    elapsed = w
  end
  local used = s_used - elapsed * limit
  if used < 0 then
    used = 0
  end
  local need = cost * w
  -- need ≤ capacity − used rather than used + need ≤ capacity: the sum could pass 2^53.
  local allowed = need <= capacity - used
  -- A clock that stepped back: the bucket refills from s_last, not from now.
  local skew = 0
  if s_last > now then
    skew = s_last - now
  end
  local used_after, retry = used, -1
  if allowed then
    used_after = used + need
  else
    retry = div_ceil(need - (capacity - used), limit) + skew
  end
  local reset = div_ceil(used_after, limit)
  if reset > 0 then
    reset = reset + skew
  end
  return allowed, div_floor(capacity - used_after, w), reset, retry, used_after, now + skew
end

-- The bucket is full again, and the state forgettable, ⌈used / limit⌉ ms after last.
local function tb_commit(key, limit, w, cost, used, last)
  call('SET', key, struct_pack(tb_format(limit, w), used, last), expiry(last + div_ceil(used, limit)))
end
