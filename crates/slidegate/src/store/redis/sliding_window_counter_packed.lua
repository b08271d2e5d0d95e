-- Sliding window counter, packed layout (layout.rs): load and commit in
-- place of sliding_window_counter.lua's, whose decide section runs between.
-- `key` is the stem of the bucket's window hashes: window n's is
-- key .. n (its number in full), and the identity's counts are its field
-- `field`. The value in window n's hash: cur + prev × (limit + 1), an
-- integer (cur: permits in window n; prev: in window n − 1, carried into it
-- by the identity's first permit of window n), below 2^52 while the limit
-- is below 2^26; from 2^26 on, struct '<dd' (cur, prev). A decision reads
-- the current window's hash, and the previous one's only when the identity
-- has no count in the current window yet: one lookup while it is active.
-- The load leaves the current window's hash in `window_key` for the commit
-- (one string built per decision, not two); where loads and commits are
-- apart (decide_all.lua) it is nil and the commit builds it again.
-- The state is never ahead of now's window (no skew): a clock that stepped
-- back decides on the windows of the time it gives (layout.rs).
--! load
local n = (now - now % w) / w
window_key = key .. format('%d', n)
local v = call('HGET', window_key, field)
if v then
  s_window = n % TWO_32
  if limit < TWO_26 then
    v = v + 0
    s_cur = v % (limit + 1)
    s_prev = (v - s_cur) / (limit + 1)
  else
    s_cur, s_prev = struct_unpack('<dd', v)
  end
else
  v = call('HGET', key .. format('%d', n - 1), field)
  s_window, s_cur, s_prev = -1, 0, 0
  if v then
    s_window = (n - 1) % TWO_32
    if limit < TWO_26 then
      v = v + 0
      s_cur = v % (limit + 1)
    else
      s_cur = struct_unpack('<dd', v)
    end
  end
end

--! commit
-- Window n's hash matters until window n + 1 ends, for every field in it:
-- one TTL for the hash, set by each identity's first permit of the window
-- (the same instant each time on the server's clock). A later permit of the
-- window adds to the count in place.
local window_key = window_key or key .. format('%d', (now - now % w) / w)
if same_window and limit < TWO_26 then
  call('HINCRBY', window_key, field, format('%d', cost))
else
  if limit < TWO_26 then
    call('HSET', window_key, field, format('%d', cur_after + prev * (limit + 1)))
  else
    call('HSET', window_key, field, struct_pack('<dd', cur_after, prev))
  end
  if not same_window then
    call(expire_key, window_key, format('%d', now - now % w + 2 * w - expire_from))
  end
end

--! keep
-- In client time, after any decision in window n, window n's hash outlives
-- window n + 1 by exactly the slack and window n − 1's outlives window n:
-- their TTLs, set by each window's first permit, run on Redis's clock, too
-- short once the client's clock stepped back, too long once it caught up
-- again (scripts.rs, KEEP). Every field in a hash matters that long, not
-- only this one's.
local n = (now - now % w) / w
for back = 0, 1 do
  local hash = key .. format('%d', n - back)
  local want = (2 - back) * w - now % w + CLIENT_TTL_SLACK_MS
  local ttl = call('PTTL', hash)
  if ttl >= 0 and ttl ~= want then
    call('PEXPIRE', hash, format('%d', want))
  end
end
