-- slidegate table: one shared table, a hash whose fields expire one by one
-- (Redis 7.0 has no HEXPIRE). Each field's value is
-- '<absolute expiry in ms>:<value>'; a read leaves out the expired ones, a
-- put at the bound forgets them, and the hash itself expires with its
-- latest entry.
--
-- KEYS[1]  the table: <prefix>{table:<name>} (one key, one Cluster slot)
-- ARGV[1]  now in ms, or -1 to read Redis TIME
-- ARGV[2]  the caller's deadline in ms on Redis's clock, or -1; a call
--          reached after it writes nothing and answers the error
--          EXPIRED <Redis ms> (as the other scripts do)
-- ARGV[3]  the operation: 'put', 'del' or 'read'
-- ARGV[4]  the most live entries the table may hold
-- ARGV[5]  TTL slack in ms for the hash's own expiry (10000 in client
--          time, 0 with Redis TIME)
-- put:     ARGV[6] field, ARGV[7] value, ARGV[8] TTL in ms
-- del:     ARGV[6] field
-- Reply:   put 1; del 1 when a live entry was removed, else 0;
--          read { field, value, ms left, ... } of the live entries;
--          the error 'TABLEFULL' when a put of a new field finds the table
--          full, or a read finds more live entries than the bound.
local call = redis.call
local now = tonumber(ARGV[1])
local deadline = tonumber(ARGV[2])
--! include deadline.lua
local op = ARGV[3]
local max = tonumber(ARGV[4])
local key = KEYS[1]

-- The expiry and value of a stored field value.
local function split(stored)
  local colon = string.find(stored, ':', 1, true)
  return tonumber(string.sub(stored, 1, colon - 1)), string.sub(stored, colon + 1)
end

if op == 'read' then
  local all = call('HGETALL', key)
  local out = {}
  local live = 0
  for i = 1, #all, 2 do
    local expiry, value = split(all[i + 1])
    if expiry > now then
      live = live + 1
      if live > max then
        return redis.error_reply('TABLEFULL the table holds its most live entries')
      end
      out[#out + 1] = all[i]
      out[#out + 1] = value
      out[#out + 1] = expiry - now
    end
  end
  return out
end

local field = ARGV[6]
if op == 'del' then
  local stored = call('HGET', key, field)
  if not stored then
    return 0
  end
  call('HDEL', key, field)
  local expiry = split(stored)
  if expiry > now then
    return 1
  end
  return 0
end

-- put. Below the bound a put is O(1): the hash holds fewer fields than
-- the bound, expired ones included. At the bound, it forgets the expired
-- ones and counts the live others.
local expires = now + tonumber(ARGV[8])
if call('HLEN', key) >= max and call('HEXISTS', key, field) == 0 then
  local others = 0
  local all = call('HGETALL', key)
  for i = 1, #all, 2 do
    if split(all[i + 1]) <= now then
      call('HDEL', key, all[i])
    else
      others = others + 1
    end
  end
  if others >= max then
    return redis.error_reply('TABLEFULL the table holds its most live entries')
  end
end
call('HSET', key, field, string.format('%d', expires) .. ':' .. ARGV[7])
-- The hash lives as long as its latest entry (an expired entry that set it
-- may keep it a little longer, never an entry shorter).
local ttl = expires - now + tonumber(ARGV[5])
if call('PTTL', key) < ttl then
  call('PEXPIRE', key, ttl)
end
return 1
