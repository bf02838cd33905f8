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
local kind, slot, decided, held, cost = parse_answer(answer)
if held == 'd' then
  return 0
end
-- Relative times as they are (a base of 0).
redis.call('HSET', KEYS[1], field, answer_value(kind, tonumber(slot), tonumber(decided), 'r', 0, cost))
return 1
