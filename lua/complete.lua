-- Ends the lease of the attempt acting on a message. ARGV[1] 'done': it was acted upon (forwarded,
-- scheduled or dead-lettered), so a redelivery is acked without acting again. 'release': the attempt
-- failed, so a retry may act at once. The answer keeps its TTL; a missing answer (expired, or Redis
-- restarted) stays missing, and a completed one stays completed.
--
-- KEYS[1]  the message's answer   drip:{rule|key}:m:<message identity>
local answer = redis.call('GET', KEYS[1])
if not answer then
  return 0
end
local head, held = string.match(answer, '^(.*):(%w+)$')
if held == 'done' then
  return 0
end
local tail = ARGV[1] == 'done' and 'done' or '0'
redis.call('SET', KEYS[1], head .. ':' .. tail, 'KEEPTTL')
return 1
