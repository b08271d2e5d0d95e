-- Fixed window, mirroring algorithm/fixed_window.rs.
-- State: one string key, struct '<dd' = window number, count.

local function fw_load(key, w)
  local v = call('GET', key)
  if v then
    local window, count = unpack_state('<dd', v)
    return window, count
  end
  return 0, 0
end

-- -> allowed, remaining, reset_after, retry_after (-1: none), new state
local function fw_decide(cost, limit, w, s_window, s_count)
  local elapsed = fmod(now, w)
  local window = (now - elapsed) / w
  local count = 0
  if s_window == window then
    count = s_count
  end
  local until_next = w - elapsed
  local allowed = count + cost <= limit
  if allowed then
    count = count + cost
  end
  local reset, retry = 0, -1
  if count > 0 then
    reset = until_next
  end
  if not allowed then
    retry = until_next
  end
  return allowed, limit - count, reset, retry, window, count
end

-- The state matters until its window ends.
local function fw_commit(key, limit, w, cost, window, count)
  call('SET', key, pack_state('<dd', window, count), expiry((window + 1) * w))
end
