-- A leased budget's home takes back what a partition gave back of its leases (schedule.rs's
-- BudgetState::take_back): events that left a window its pool leased, so that other partitions
-- can lease those units. Each return is the partition's total given back of the window, so a
-- return sent twice, or two out of order, takes back nothing more. A window the home has dropped
-- (it has passed) takes nothing back.
--
-- KEYS[1]  the home's hash (drip:{b:<tag>}:budget:<name>): '<per>:<window>' what it leased of the
--          window in all, '<per>:<window>:p<partition>:r' what that partition gave back of it
-- Arguments, in order: partition, then how many returns, then each as per, window, total.
--
-- Returns the units taken back by this call.

local key = KEYS[1]
local partition = int()
local taken_now = 0
for _ = 1, int() do
  local per, window, total = int(), int(), int()
  local name = per .. ':' .. window
  local taken_field = name .. ':p' .. partition .. ':r'
  local held = redis.call('HMGET', key, name, taken_field)
  local leased, taken = tonumber(held[1]), tonumber(held[2]) or 0
  if leased then
    local new = math.min(math.max(total - taken, 0), leased)
    if new > 0 then
      redis.call('HINCRBY', key, name, -new)
      taken_now = taken_now + new
      -- The earliest window given back: lua/lease.lua's lease_reopened offers it.
      local reopened = tonumber(redis.call('HGET', key, 'o:' .. per))
      if not reopened or window < reopened then
        redis.call('HSET', key, 'o:' .. per, window)
      end
    end
    if total > taken then
      redis.call('HSET', key, taken_field, total)
    end
  end
end
return taken_now
