-- The clock and the caller's deadline of a script that decides nothing
-- (lift, table, give back), included where the main script has set `now`
-- (ms, or -1 to read Redis TIME) and `deadline` (ms on Redis's clock, or
-- -1: none). A call Redis reaches after the deadline was counted as failed
-- by the caller: it changes nothing and answers the error
-- EXPIRED <Redis ms>, with the server's time the caller learns its clock
-- offset from. (The deciding scripts do the same in the prelude.)
if now < 0 or deadline >= 0 then
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  local server_now = tonumber(t[1]) * 1000 + (us - math.fmod(us, 1000)) / 1000
  if now < 0 then
    now = server_now
  end
  if deadline >= 0 and server_now > deadline then
    return redis.error_reply(string.format('EXPIRED %d', server_now))
  end
end
