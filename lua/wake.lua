-- Arms the wake of an entity's drain of parked messages (schedule.rs's Scheduler::arm_wake): when
-- messages are parked and no wake is armed (or the one armed passed WAKE_LOST_AFTER ago without a
-- drain re-arming it: its task was never made), records one at `wanted` (not before now, nor
-- later than MAX_WAKE_GAP from now) and returns it; else nil.
--
-- KEYS[1]  the entity's state hash   drip:{rule|key}:state ('q': how many are parked, 'wk': the wake)
-- ARGV     now ('' for the server's TIME), wanted
local key = KEYS[1]
local now = clock(int())
local wanted, lost_after = int(), WAKE_LOST_AFTER
local held = redis.call('HMGET', key, 'q', 'wk')
local parked, wake = tonumber(held[1]) or 0, tonumber(held[2])
if parked == 0 or (wake and wake + lost_after >= now) then
  return false
end
wake = math.min(math.max(wanted, now), now + MAX_WAKE_GAP)
redis.call('HSET', key, 'wk', wake)
return wake
