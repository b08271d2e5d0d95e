-- Sliding log, mirroring algorithm/sliding_log.rs. Its load / decide /
-- commit sections follow the contract in scripts.rs.
-- State: one sorted set, one member per admitted permit, scored by its
-- admission time in ms. A permit admitted at t counts while now < t + W,
-- i.e. while t ≥ now − W + 1. Only an allowed request writes (trims the
-- expired entries, adds its own); a denial reads.
--! state log_key, count
--! charged count_before

--! load
-- The key (decide reads more of it), and the permits still counting.
log_key, count = key, call('ZCOUNT', key, now - w + 1, '+inf')

--! decide
count_before = count
allowed = count + cost <= limit
local newest
if allowed and cost > 0 then
  newest = now
elseif count > 0 then
  newest = tonumber(call('ZRANGE', log_key, -1, -1, 'WITHSCORES')[2])
end
reset, retry = 0, -1
if newest then
  reset = newest + w - now
end
remaining = limit - count
if allowed then
  remaining = remaining - cost
else
  -- The request fits once the oldest count + cost − limit live permits expire.
  local must_expire = count + cost - limit
  local entry = call('ZRANGE', log_key, now - w + 1, '+inf', 'BYSCORE', 'LIMIT', must_expire - 1, 1, 'WITHSCORES')
  retry = tonumber(entry[2]) + w - now
end

--! commit
-- Members are "<now>:<n>", n counting on from the permits still live: with
-- time not going backwards for an identity they are unique; if it did go
-- backwards and a name is taken, ZADD adds fewer and the loop names more.
call('ZREMRANGEBYSCORE', key, '-inf', now - w)
local added, n = 0, count_before
while added < cost do
  local args, batch = {}, math.min(cost - added, 256)
  for i = 1, batch do
    args[2 * i - 1] = now
    args[2 * i] = format('%d:%d', now, n)
    n = n + 1
  end
  added = added + call('ZADD', key, unpack(args))
end
-- The key lives until its newest entry expires. That is now + w unless a
-- clock stepped back and left entries stamped later: timing from now
-- would forget them (and on the client's clock, the TTL slack covers a
-- step back of 10 s at most).
local newest = tonumber(call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
local at = format('%d', newest + w - expire_from)
if client_time then
  call('PEXPIRE', key, at)
else
  call('PEXPIREAT', key, at)
end

--! keep
-- The log lives until its newest entry stops counting (as the commit sets):
-- `reset` counts from now when this call admitted a permit, short of it
-- while entries stamped before a step back of the clock lie later.
local newest = call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]
if newest then
  local left = newest + w - now
  if left < 0 then
    left = 0
  end
  local want = left + CLIENT_TTL_SLACK_MS
  local ttl = call('PTTL', key)
  if ttl >= 0 and ttl ~= want then
    call('PEXPIRE', key, format('%d', want))
  end
end
