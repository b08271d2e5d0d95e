-- Sliding window counter, mirroring algorithm/sliding_window_counter.rs.
-- Its load / decide / commit sections follow the contract in scripts.rs.
-- State: one string key, struct '<I4I4I4' = window number modulo 2^32,
-- cur, prev ('<I4dd' when the limit needs more than 32 bits). No key reads
-- as window -1: no count in any window that matters.
--! state s_window, s_cur, s_prev
--! charged window, cur_after, prev, same_window

--! load
local v = call('GET', key)
if not v then
  s_window, s_cur, s_prev = -1, 0, 0
elseif limit < TWO_32 then
  s_window, s_cur, s_prev = struct_unpack('<I4I4I4', v)
else
  s_window, s_cur, s_prev = struct_unpack('<I4dd', v)
end

--! decide
-- Decides, and gives the state after charging and whether the key already
-- holds this window (its TTL is then right).
local elapsed = now % w
window = (now - elapsed) / w % TWO_32
local skew = 0
if s_window ~= window and s_window >= 0 and (s_cur > 0 or s_prev > 0) then
  local ahead = (s_window - window + TWO_32) % TWO_32
  if ahead < TWO_32 / 2 then
    skew = ahead * w - elapsed
    elapsed, window = 0, s_window
  end
end
local cur = 0
prev = 0
same_window = s_window == window
if same_window then
  cur, prev = s_cur, s_prev
elseif (s_window + 1) % TWO_32 == window then
  prev = s_cur
end
-- prev × (W − e) ≤ limit × W ≤ 2^53
local prev_weight = prev * (w - elapsed)
allowed = cur + cost <= limit and prev_weight <= (limit - cur - cost) * w
cur_after = cur
if allowed then
  cur_after = cur + cost
end
-- limit − cur_after − ⌈prev_weight / W⌉, at least 0 (prev_weight reaches
-- 2^53 only as limit × W itself, a multiple of W: `%` is exact)
local r = prev_weight % w
remaining = limit - cur_after - (prev_weight - r) / w
if r > 0 then
  remaining = remaining - 1
end
if remaining < 0 then
  remaining = 0
end
reset = 0
if cur_after > 0 then
  reset = 2 * w - elapsed + skew
elseif prev > 0 then
  reset = w - elapsed + skew
end
retry = -1
if not allowed then
  -- Within this window at W − ⌊(limit − cur − cost) × W / prev⌋, if before
  -- its end; otherwise in the next one, where cur becomes the previous
  -- count: at W − ⌊(limit − cost) × W / cur⌋ into it, or as it starts when
  -- cur alone leaves room for cost.
  local at = w
  if cur + cost <= limit and prev > 0 then
    local a = (limit - cur - cost) * w
    at = w - (a - fmod(a, prev)) / prev
  end
  if at < w then
    retry = at - elapsed + skew
  else
    local at_next = 0
    if cur > 0 then
      local a = (limit - cost) * w
      at_next = w - (a - fmod(a, cur)) / cur
      if at_next < 0 then
        at_next = 0
      end
    end
    retry = w - elapsed + at_next + skew
  end
end

--! commit
-- The state matters until the end of the next window. A key that already
-- holds this window has exactly that expiry: SETRANGE rewrites the value in
-- place and keeps it (cheaper than SET … KEEPTTL, whose reply is a table).
-- (In client time, a clock that stepped back leaves that expiry short of
-- the state; the keep after the decision sets it: scripts.rs, KEEP.)
-- The GET of this script saw the key, and keys do not expire while a
-- script runs, so SETRANGE never creates one without a TTL.
local value
if limit < TWO_32 then
  value = struct_pack('<I4I4I4', window, cur_after, prev)
else
  value = struct_pack('<I4dd', window, cur_after, prev)
end
if same_window then
  call('SETRANGE', key, '0', value)
else
  call('SET', key, value, expire_how, format('%d', now - now % w + 2 * w - expire_from))
end
