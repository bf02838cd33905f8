-- Marks a message's answer as acted upon (forwarded, scheduled or dead-lettered), so that a
-- redelivery of it is acked without acting again. The answer keeps its TTL; a missing answer
-- (expired, or Redis restarted) stays missing.
--
-- KEYS[1]  the message's answer   drip:{rule|key}:m:<message id>
local answer = redis.call('GET', KEYS[1])
if answer and not string.find(answer, ':done', 1, true) then
  redis.call('SET', KEYS[1], answer .. ':done', 'KEEPTTL')
end
return 0
