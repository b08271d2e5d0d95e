-- Sliding window counter, mirroring algorithm/sliding_window_counter.rs.
-- State: one string key, struct '<ddd' = window number, cur, prev.

local function swc_load(key, w)
  local v = call('GET', key)
  if v then
    local window, cur, prev = unpack_state('<ddd', v)
    return window, cur, prev
  end
  return 0, 0, 0
end

-- -> allowed, remaining, reset_after, retry_after (-1: none), new state
local function swc_decide(cost, limit, w, s_window, s_cur, s_prev)
  local elapsed = fmod(now, w)
  local window = (now - elapsed) / w
  local cur, prev = 0, 0
  if s_window == window then
    cur, prev = s_cur, s_prev
  elseif s_window + 1 == window then
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
  return allowed, remaining, reset, retry, window, cur_after, prev
end

-- The state matters until the end of the window after `window`.
local function swc_commit(key, limit, w, cost, window, cur, prev)
  call('SET', key, pack_state('<ddd', window, cur, prev), expiry((window + 2) * w))
end
