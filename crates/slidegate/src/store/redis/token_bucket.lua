-- Token bucket, mirroring algorithm/token_bucket.rs. Its load / decide /
-- commit sections follow the contract in scripts.rs.
-- State: one string key, struct '<I6I6' = used (units of 1/W token missing
-- from a full bucket), last_ms ('<dI6' when limit × W needs more than 48
-- bits; ms since the epoch fit 48 bits until the year 10889). No key is a
-- full bucket.
--! state s_used, s_last
--! charged used_after, last

--! load
local v = call('GET', key)
if not v then
  s_used, s_last = 0, 0
elseif limit * w < TWO_48 then
  s_used, s_last = struct_unpack('<I6I6', v)
else
  s_used, s_last = struct_unpack('<dI6', v)
end

--! decide
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
allowed = need <= capacity - used
-- A clock that stepped back: the bucket refills from s_last, not from now.
local skew = 0
if s_last > now then
  skew = s_last - now
end
used_after, last, retry = used, now + skew, -1
if allowed then
  used_after = used + need
else
  -- ⌈(need − (capacity − used)) / limit⌉
  local over = need - (capacity - used)
  local r = fmod(over, limit)
  retry = (over - r) / limit + skew
  if r > 0 then
    retry = retry + 1
  end
end
-- ⌈used_after / limit⌉, then ⌊(capacity − used_after) / W⌋
local r = fmod(used_after, limit)
reset = (used_after - r) / limit
if r > 0 then
  reset = reset + 1
end
if reset > 0 then
  reset = reset + skew
end
local room = capacity - used_after
remaining = (room - fmod(room, w)) / w

--! commit
-- The bucket is full again, and the state forgettable, ⌈used / limit⌉ ms after last.
local value
if limit * w < TWO_48 then
  value = struct_pack('<I6I6', used_after, last)
else
  value = struct_pack('<dI6', used_after, last)
end
local r = fmod(used_after, limit)
local idle_at = last + (used_after - r) / limit
if r > 0 then
  idle_at = idle_at + 1
end
call('SET', key, value, expire_how, format('%d', idle_at - expire_from))
