-- Fixed window, mirroring algorithm/fixed_window.rs. Its load / decide /
-- commit sections follow the contract in scripts.rs.
-- State: one string key, struct '<I4I4' = window number modulo 2^32, count
-- ('<I4d' when the limit needs more than 32 bits). No key reads as window
-- -1, which no window matches.
--! state s_window, s_count
--! charged window, count, same_window

--! load
local v = call('GET', key)
if not v then
  s_window, s_count = -1, 0
elseif limit < TWO_32 then
  s_window, s_count = struct_unpack('<I4I4', v)
else
  s_window, s_count = struct_unpack('<I4d', v)
end

--! decide
-- Decides, and gives the state after charging and whether the key already
-- holds this window (its TTL is then right).
local elapsed = now % w
window = (now - elapsed) / w % TWO_32
local skew = 0
if s_window ~= window and s_window >= 0 and s_count > 0 then
  local ahead = (s_window - window + TWO_32) % TWO_32
  if ahead < TWO_32 / 2 then
    skew = ahead * w - elapsed
    elapsed, window = 0, s_window
  end
end
count = 0
same_window = s_window == window
if same_window then
  count = s_count
end
local until_next = w - elapsed + skew
allowed = count + cost <= limit
if allowed then
  count = count + cost
end
remaining, reset, retry = limit - count, 0, -1
if count > 0 then
  reset = until_next
end
if not allowed then
  retry = until_next
end

--! commit
-- The state matters until its window ends; a key already in this window
-- carries that expiry, and SETRANGE keeps it (see sliding_window_counter.lua).
local value
if limit < TWO_32 then
  value = struct_pack('<I4I4', window, count)
else
  value = struct_pack('<I4d', window, count)
end
if same_window then
  call('SETRANGE', key, '0', value)
else
  call('SET', key, value, expire_how, format('%d', now - now % w + w - expire_from))
end
