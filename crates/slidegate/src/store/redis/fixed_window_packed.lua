-- Fixed window, packed layout (layout.rs): load and commit in place of
-- fixed_window.lua's, whose decide section runs between. `key` is the stem
-- of the bucket's window hashes: window n's is key .. n (its number in
-- full), and the identity's count is its field `field`, an integer. The
-- load leaves that hash's name in `window_key` for the commit (see
-- sliding_window_counter_packed.lua).
--! load
local n = (now - now % w) / w
window_key = key .. format('%d', n)
local v = call('HGET', window_key, field)
if v then
  s_window, s_count = n % TWO_32, v + 0
else
  s_window, s_count = -1, 0
end

--! commit
-- Window n's hash matters until the window ends, for every field in it:
-- one TTL for the hash, set by each identity's first permit of the window.
local window_key = window_key or key .. format('%d', (now - now % w) / w)
call('HINCRBY', window_key, field, format('%d', cost))
if not same_window then
  call(expire_key, window_key, format('%d', now - now % w + w - expire_from))
end

--! keep
-- In client time, window n's hash outlives the window by exactly the slack
-- after any decision in it (see sliding_window_counter_packed.lua).
local hash = key .. format('%d', (now - now % w) / w)
local want = w - now % w + CLIENT_TTL_SLACK_MS
local ttl = call('PTTL', hash)
if ttl >= 0 and ttl ~= want then
  call('PEXPIRE', hash, format('%d', want))
end
