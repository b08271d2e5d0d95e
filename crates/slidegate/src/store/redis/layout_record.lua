-- slidegate layout record: the layout every store deciding under a prefix
-- shares, written by the first and checked (and kept alive) by every other.
-- KEYS[1]  <prefix>layout
-- ARGV[1]  this store's layout as recorded: `per_key` or `packed <buckets>`
-- ARGV[2]  how long the record lives after this call, ms (decimal)
-- Reply    the layout recorded. When the key was missing it is written with
--          ARGV[1] (SET NX semantics, inside one script) and that is the
--          reply; when it holds ARGV[1] its TTL is lengthened to ARGV[2] if
--          shorter; when it holds another layout it is left as it is.
--          A key of another type: the error LAYOUT_RECORD <its type>.
local call = redis.call
local kind = call('TYPE', KEYS[1]).ok
if kind == 'none' then
  call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
if kind ~= 'string' then
  return redis.error_reply('LAYOUT_RECORD ' .. kind)
end
local recorded = call('GET', KEYS[1])
if recorded == ARGV[1] and call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  -- A record without expiry (-1, written by hand) gets one too.
  call('PEXPIRE', KEYS[1], ARGV[2])
end
return recorded
