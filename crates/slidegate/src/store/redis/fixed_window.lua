-- Fixed window, mirroring algorithm/fixed_window.rs. Its load /
-- decide / commit functions follow the contract in scripts.rs.
-- State: one string key, struct '<I4I4' = window number modulo 2^32, count
-- ('<I4d' when the limit needs more than 32 bits). No key reads as window
-- -1, which no window matches.

local function fw_format(limit)
  if limit < TWO_32 then
    return '<I4I4'
  end
  return '<I4d'
end

local function fw_load(key, limit, w)
  local v = call('GET', key)
  if v then
    local window, count = struct_unpack(fw_format(limit), v)
    return window, count
  end
  return -1, 0
end

-- -> the decision, then the new state and whether the key already holds
--    this window (its TTL is then right).
local function fw_decide(cost, limit, w, s_window, s_count)
  local elapsed = fmod(now, w)
  local window = fmod((now - elapsed) / w, TWO_32)
  local skew = 0
  if s_count > 0 then
    skew = window_skew(s_window, window, elapsed, w)
  end
  if skew > 0 then
    elapsed, window = 0, s_window
  end
  local count = 0
  if s_window == window then
    count = s_count
  end
  local until_next = w - elapsed + skew
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
  return allowed, limit - count, reset, retry, window, count, s_window == window
end

-- The state matters until its window ends; a key already in this window
-- carries that expiry.
local function fw_commit(key, limit, w, cost, window, count, same_window)
  local value = struct_pack(fw_format(limit), window, count)
  if same_window then
    call('SET', key, value, 'KEEPTTL')
  else
    local elapsed = fmod(now, w)
    call('SET', key, value, expiry(now - elapsed + w))
  end
end
