-- A fair budget's ring of waiting keys (schedule/fair.rs): one operation a call. A key joins the
-- ring, and arms its drain's wake unless one is armed, in the reservation script's call that
-- parks it (lua/reserve/parking.lua).
--
-- KEYS[1]  the ring        drip:{b:tag}:fair:<budget>    sorted set: '<rule id>\n<key>' by when it joined
-- KEYS[2]  its drain's     drip:{b:tag}:fair:<budget>:m  hash: 'c' where the next drain starts, 'wk' its wake
-- KEYS[3]  (leave) the member's state hash ('q': how many of its messages are parked)
-- ARGV     the operation, then its own:
--   leave   member              it leaves unless messages of it are parked (no KEYS[3]: its rule
--                                is gone, it leaves): 1 left, 0 stayed
--   turned  now ('' for TIME), cursor, wake ('' none)   a drain ended: where the next starts, and
--                                its wake; with none while keys still wait (one joined during the
--                                drain, whose wake found this one armed), one at now: the wake
local ring, drain = KEYS[1], KEYS[2]
local op = str()
if op == 'leave' then
  local member = str()
  if KEYS[3] and (tonumber(redis.call('HGET', KEYS[3], 'q')) or 0) > 0 then
    return 0
  end
  redis.call('ZREM', ring, member)
  return 1
elseif op == 'turned' then
  local now = clock(int())
  local cursor, wake = int(), int()
  redis.call('HSET', drain, 'c', cursor)
  if not wake and redis.call('ZCARD', ring) > 0 then
    wake = now
  end
  if wake then
    redis.call('HSET', drain, 'wk', wake)
  else
    redis.call('HDEL', drain, 'wk')
  end
  return wake
end
return redis.error_reply('drip: unknown fair ring operation ' .. tostring(op))
