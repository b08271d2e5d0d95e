-- Sliding window counter, mirroring algorithm/sliding_window_counter.rs.
-- Its load / decide / commit functions follow the contract in scripts.rs.
-- State: one string key, struct '<I4I4I4' = window number modulo 2^32,
-- cur, prev ('<I4dd' when the limit needs more than 32 bits). No key reads
-- as window -1: no count in any window that matters.

local function swc_format(limit)
  if limit < TWO_32 then
    return '<I4I4I4'
  end
  return '<I4dd'
end

local function swc_load(key, limit, w)
  local v = call('GET', key)
  if v then
    local window, cur, prev = struct_unpack(swc_format(limit), v)
    return window, cur, prev
  end
  return -1, 0, 0
end

-- -> the decision, then the new state and whether the key already holds
--    this window (its TTL is then right).
local function swc_decide(cost, limit, w, s_window, s_cur, s_prev)
  local elapsed = now % w
  local window = (now - elapsed) / w % TWO_32
  local skew = 0
  if s_window ~= window and (s_cur > 0 or s_prev > 0) then
    skew = window_skew(s_window, window, elapsed, w)
  end
  if skew > 0 then
    elapsed, window = 0, s_window
  end
  local cur, prev = 0, 0
  if s_window == window then
    cur, prev = s_cur, s_prev
  elseif (s_window + 1) % TWO_32 == window then
    prev = s_cur
  end
  -- prev × (W − e) ≤ limit × W ≤ 2^53
  local prev_weight = prev * (w - elapsed)
  local allowed = cur + cost <= limit and prev_weight <= (limit - cur - cost) * w
  local cur_after = cur
  if allowed then
    cur_after = cur + cost
  end
  local remaining = limit - cur_after - div_ceil(prev_weight, w)
  if remaining < 0 then
    remaining = 0
  end
  local reset = 0
  if cur_after > 0 then
    reset = 2 * w - elapsed
  elseif prev > 0 then
    reset = w - elapsed
  end
  local retry = -1
  if not allowed then
    local at
    if cur + cost <= limit and prev > 0 then
      at = w - div_floor((limit - cur - cost) * w, prev)
    end
    if at and at < w then
      retry = at - elapsed
    else
      -- In the next window cur becomes the previous count; when it alone
      -- leaves room for cost, the request fits as that window starts.
      local at_next = 0
      if cur > 0 then
        at_next = w - div_floor((limit - cost) * w, cur)
        if at_next < 0 then
          at_next = 0
        end
      end
      retry = (w - elapsed) + at_next
    end
  end
  if reset > 0 then
    reset = reset + skew
  end
  if retry >= 0 then
    retry = retry + skew
  end
  return allowed, remaining, reset, retry, window, cur_after, prev, s_window == window
end

-- The state matters until the end of the next window. A key that already
-- holds this window has exactly that expiry: keep it (KEEPTTL skips
-- rewriting the expiry, a third of the cost of the write).
local function swc_commit(key, limit, w, cost, window, cur, prev, same_window)
  local value = struct_pack(swc_format(limit), window, cur, prev)
  if same_window then
    call('SET', key, value, 'KEEPTTL')
  else
    call('SET', key, value, expiry(now - now % w + 2 * w))
  end
end
