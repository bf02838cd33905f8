-- A leased budget's home grants a partition units of one limit (schedule.rs's BudgetState::grant):
-- the first window from `from` up to `horizon` whose leases leave room for `cost` of `count` is
-- leased to the partition, up to `want` units, never past `count`. The home is the budget's hash
-- (drip:{b:<tag>}:budget:<name>): '<per>:<window>' what it leased of that window in all,
-- '<per>:<window>:p<partition>' what it leased the partition, '<per>:<window>:p<partition>:r' what
-- the partition gave back of it (lua/returns.lua), 'lo:<per>' its oldest window.
--
-- KEYS[1]  the home's hash
-- Arguments, in order: now ('' for the server's TIME), partition, partitions, per, from, horizon,
-- count, cost, want, keep (how long the hash outlives a window it leased, past the window).
--
-- Returns the window (0 and found = 0 for none), the partition's total lease of it (a total, so
-- that crediting it twice or out of order changes nothing), the last window before it with no
-- room, found (1 or 0), and the units this call leased.

local key = KEYS[1]
local now = clock(int())
local partition, partitions, per, from, horizon = int(), int(), int(), int(), int()
local count, cost, want, keep = int(), int(), int(), int()

-- Windows before now's lease nothing more: dropped (a few at a time, or by a scan after a gap).
local current = now - now % per
local lo = tonumber(redis.call('HGET', key, 'lo:' .. per))
if lo and lo < current then
  drop_windows(key, per, lo, current, function(name, dead)
    for p = 0, partitions - 1 do
      dead[#dead + 1] = name .. ':p' .. p
      dead[#dead + 1] = name .. ':p' .. p .. ':r'
    end
  end)
end
if not lo or lo < current then
  redis.call('HSET', key, 'lo:' .. per, current)
end

-- The home's clock decides what has passed: a window before now's was dropped above with what it
-- leased, so a partition whose own call saw an earlier now (its reply travelled, time moved on)
-- is never leased it afresh. (The model has one clock: there `from` is never before now's window.)
local window = math.max(from, current)
while window <= horizon do
  local name = per .. ':' .. window
  local total = tonumber(redis.call('HGET', key, name)) or 0
  if total + cost <= count then
    -- A scarce window (less room than asked) is split: at most half of what is left, at least the
    -- cost, so partitions asking in turn share it.
    local room = count - total
    local units = want
    if want > room then
      units = math.max(math.ceil(room / 2), cost)
    end
    redis.call('HINCRBY', key, name, units)
    local held = redis.call('HINCRBY', key, name .. ':p' .. partition, units)
    local ttl = window + keep - now
    if redis.call('PTTL', key) < ttl then
      redis.call('PEXPIRE', key, ttl)
    end
    return {window, held, window - per, 1, units}
  end
  window = window + per
end
return {0, 0, window - per, 0, 0}
