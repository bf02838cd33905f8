-- Ends the lease of an attempt that failed, so that a retry may act at once. (Completing is a plain
-- HSET from Rust; releasing is a script because it must not undo a completion another attempt
-- recorded meanwhile.) A missing answer (expired, or Redis restarted) stays missing.
--
-- KEYS[1]  the answers hash of the message's minute   drip:{rule|key}:a:<minute>
-- Argument: the message's answer field.
local field = str()
local answer = redis.call('HGET', KEYS[1], field)
if not answer then
  return 0
end
local kind, slot, decided, held = parse_answer(answer)
if held == 'd' then
  return 0
end
redis.call('HSET', KEYS[1], field, kind .. slot .. ':' .. decided .. ':r')
return 1
