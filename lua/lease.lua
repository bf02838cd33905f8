-- A leased budget's home grants a partition units of one limit (schedule.rs's BudgetState::grant):
-- the first window from `from` up to `horizon` with room for `cost` of `count` leases it `want`
-- units, or more: its share of the window's count by demand (count * want / the partitions'
-- demands, rounded up) less what it holds there; with `term` 1 (a long limit, or one whose window
-- lies in a nearly full window of a longer limit: below) only what it asks for. A partition's
-- demand is what it last asked for; one that has not asked within LEASE_TERM counts as asking as
-- much as this one. The same call leases it part of each of the term's next windows (`term`
-- windows in all), as far as their room goes: as much as it now holds of that first window, at
-- most its share of the count by demand, less what it holds there. The walk stops at a full window past `from` that the partition holds a lease of
-- (its pool may have room there): the answer then only says the windows before are full.
--
-- The home is the budget's hash (drip:{b:<tag>}:budget:<name>): '<per>:<window>' what it leased
-- of that window in all, '<per>:<window>:p<partition>' what it leased the partition,
-- '<per>:<window>:p<partition>:r' what the partition gave back of it (lua/returns.lua),
-- 'lo:<per>' its oldest window, 'd:<per>:p<partition>' what the partition last asked for (a fair
-- budget's: with what it held of the window it asked from) and when ('<units>:<time>'), 'o:<per>'
-- the earliest window a partition gave units back in since a grant last looked there.
--
-- A fair budget's home (`fair` 1; BudgetState::grant_fair) shares each window max-min fair among
-- the partitions that asked within FAIR_DEMAND_LIFE windows, by what each last asked for and held
-- of the window it asked from: each is owed its part less what it holds there, and the first
-- window in which what is not owed to the others leaves room for `cost` leases the partition up
-- to `want` of it; nothing ahead.
--
-- KEYS[1]  the home's hash
-- Arguments, in order: now ('' for the server's TIME), partition, partitions, per, from, horizon,
-- count, cost, want, keep (how long the hash outlives a window it leased, past the window), term,
-- fair (1 or 0), and for an adaptive budget its ceiling, step (ppm) and window (ms), else 0 0 0:
-- the home grants from the count at its level in force ('adapt', set by lua/budget.lua); then
-- reach, the first window the partition's pool can still book (0: any); then how many longer
-- limits of the budget hold this one's windows, and each one's per and count.
--
-- A budget that is not fair also leases units given back before `from` (lease_reopened below).
--
-- Returns the window (0 and found = 0 for none), the partition's total lease of it (a total, so
-- that crediting it twice or out of order changes nothing), the last window before it with no
-- room, found (1 or 0), the units this call leased in all, then each window of the term leased
-- ahead and the partition's total of it.

local key = KEYS[1]
local now = clock(int())
local partition, partitions, per, from, horizon = int(), int(), int(), int(), int()
local count, cost, want, keep, term = int(), int(), int(), int(), int()
local fair = int() == 1
local ceiling, step, level_window = int(), int(), int()
local reach = int()
local level = ceiling > 0 and level_in_force(redis.call('HGET', key, 'adapt'), ceiling, step, level_window, now)
if level then
  count = scaled(count, level, cost)
end
-- A window of a longer limit that holds `from`'s and has less left than two terms of this
-- limit's count leases this one as asked, one window (schedule.rs's nearly_full_around): shares
-- held there by a partition whose events stop are room of it the others lose. (A fair budget's
-- grant has no term.)
for _ = 1, int() do
  local long, long_count = int(), int()
  if level then
    long_count = scaled(long_count, level, cost)
  end
  if term > 1 and not fair then
    local leased = tonumber(redis.call('HGET', key, long .. ':' .. (from - from % long))) or 0
    if long_count - leased < 2 * term * count then
      term = 1
    end
  end
end

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

-- What is left of a window's count, and what the partition holds of it.
local function room_and_held(window)
  local name = per .. ':' .. window
  local got = redis.call('HMGET', key, name, name .. ':p' .. partition)
  return count - (tonumber(got[1]) or 0), tonumber(got[2]) or 0
end

local function lease_units(window, units)
  local name = per .. ':' .. window
  redis.call('HINCRBY', key, name, units)
  return redis.call('HINCRBY', key, name .. ':p' .. partition, units)
end

local function keep_until(last)
  local ttl = last + keep - now
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end

-- The home's clock decides what has passed: a window before now's was dropped above with what it
-- leased, so a partition whose own call saw an earlier now (its reply travelled, time moved on)
-- is never leased it afresh. (The model has one clock: there `from` is never before now's window.)
local start = math.max(from, current)

-- The live partitions' demands, this one's as it asks now: a fair budget's, what it asks for and
-- what it holds of the window it asks from (all it wants of that window).
local demand = want
if fair then
  demand = want + (tonumber(redis.call('HGET', key, per .. ':' .. start .. ':p' .. partition)) or 0)
end
redis.call('HSET', key, 'd:' .. per .. ':p' .. partition, demand .. ':' .. now)

-- The walk of both grants: the first window from `start` up to `horizon` where what
-- `open_of(window)` says it may lease the partition (and what it holds there) leaves room for
-- the cost: that window, what is open and what it holds; else nil and the last window before it
-- with no room. It stops at a full window past `start` that the partition holds a lease of (its
-- pool may have room there).
local function first_open(open_of)
  local window = start
  while window <= horizon do
    local open, held = open_of(window)
    if open >= cost then
      return window, open, held
    end
    if window > start and held > 0 then
      break
    end
    window = window + per
  end
  return nil, window - per
end

if fair then
  -- The live demands in order (units, then partition), and each one's max-min part of the count.
  local live = {}
  for q = 0, partitions - 1 do
    local units, at = string.match(redis.call('HGET', key, 'd:' .. per .. ':p' .. q) or '', '^(%d+):(%-?%d+)$')
    if units and tonumber(at) + FAIR_DEMAND_LIFE * per > now then
      live[#live + 1] = {q = q, units = tonumber(units)}
    end
  end
  table.sort(live, function(a, b)
    return a.units < b.units or (a.units == b.units and a.q < b.q)
  end)
  local left = count
  for i = 1, #live do
    local n = #live - i + 1
    live[i].part = math.min(live[i].units, math.floor((left + n - 1) / n))
    left = math.max(left - live[i].part, 0)
  end
  local window, open = first_open(function(window)
    local name = per .. ':' .. window
    -- What it leased in all, what the partition holds (it is live: it just asked) and what the
    -- others are still owed of their parts.
    local total, held, owed = tonumber(redis.call('HGET', key, name)) or 0, 0, 0
    for i = 1, #live do
      local has = tonumber(redis.call('HGET', key, name .. ':p' .. live[i].q)) or 0
      if live[i].q == partition then
        held = has
      elseif live[i].part > has then
        owed = owed + live[i].part - has
      end
    end
    return count - total - owed, held
  end)
  if not window then
    -- (`open` is then the last window with no room.)
    return {0, 0, open, 0, 0}
  end
  local units = math.min(want, open)
  local leased = lease_units(window, units)
  keep_until(window)
  return {window, leased, window - per, 1, units}
end
-- Units given back before `start` since a grant last looked there ('o:<per>', set by
-- lua/returns.lua; BudgetState::lease_reopened): a partition told those windows were full asks only
-- past them, so it is also leased up to `want` of the first window from the mark with room for the
-- cost, if that lies at or past `reach` (the first window its pool can still book). The mark moves
-- to that window, or goes when a walk from it found none; one whose reach lies past the mark leaves
-- it for the others. Returns the window and the partition's total there, or nil.
local function lease_reopened()
  local field = 'o:' .. per
  local mark = tonumber(redis.call('HGET', key, field))
  if not mark then
    return nil
  elseif mark + per <= now then
    redis.call('HDEL', key, field)
    return nil
  end
  local first, found, room = math.max(mark, reach), nil, 0
  for window = first, start - per, per do
    room = count - (tonumber(redis.call('HGET', key, per .. ':' .. window)) or 0)
    if room >= cost then
      found = window
      break
    end
  end
  if first == mark then
    if found then
      redis.call('HSET', key, field, found)
    else
      redis.call('HDEL', key, field)
    end
  end
  if not found then
    return nil
  end
  local units = math.min(want, room)
  keep_until(found)
  return found, lease_units(found, units), units
end
local reopened, reopened_total, reopened_units = lease_reopened()

-- The reply with the reopened window's lease after the others.
local function with_reopened(reply)
  if reopened then
    reply[#reply + 1], reply[#reply + 2] = reopened, reopened_total
    reply[5] = reply[5] + reopened_units
  end
  return reply
end

-- A partition that has not asked within the term counts as asking as much as this one.
local demands = 0
for q = 0, partitions - 1 do
  local units, at = string.match(redis.call('HGET', key, 'd:' .. per .. ':p' .. q) or '', '^(%d+):(%-?%d+)$')
  if units and tonumber(at) + LEASE_TERM > now then
    demands = demands + tonumber(units)
  else
    demands = demands + want
  end
end
demands = math.max(demands, 1)

local window, open, before = first_open(room_and_held)
if not window then
  -- (`open` is then the last window with no room.)
  return with_reopened({0, 0, open, 0, 0})
end
local share = math.floor((count * want + demands - 1) / demands)
-- A long window's share is too much to strand when the partition's events stop: it gets what it
-- asks for.
local topped = 0
if term > 1 then
  topped = share - before
end
local units = math.min(math.max(want, topped), open)
local held = lease_units(window, units)
local reply = {window, held, window - per, 1, units}
local part = math.min(held, share)
local last = window
for k = 1, term - 1 do
  local ahead = window + k * per
  if ahead > horizon then
    break
  end
  local open_ahead, held_ahead = room_and_held(ahead)
  local more = math.min(part - held_ahead, open_ahead)
  if more > 0 then
    reply[#reply + 1] = ahead
    reply[#reply + 1] = lease_units(ahead, more)
    reply[5] = reply[5] + more
    last = ahead
  end
end
keep_until(last)
return with_reopened(reply)
