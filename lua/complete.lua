-- Ends the lease of the attempt acting on a message. ARGV[2] 'done': it was acted upon (forwarded,
-- scheduled or dead-lettered), so a redelivery is acked without acting again. 'release': the attempt
-- failed, so a retry may act at once. A missing answer (expired, or Redis restarted) stays missing,
-- and a completed one stays completed.
--
-- KEYS[1]  the answers hash of the message's minute   drip:{rule|key}:a:<minute>
-- ARGV[1]  the message's answer field
local answer = redis.call('HGET', KEYS[1], ARGV[1])
if not answer then
  return 0
end
local head, held = string.match(answer, '^(.*):(%-?%w+)$')
if held == 'd' then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], head .. ':' .. (ARGV[2] == 'done' and 'd' or 'r'))
return 1
