-- Feedback on a shared budget: pause it, or lower its adaptive level (AIMD), atomically.
--
-- KEYS[1]  the budget's hash   drip:{b:<tag>}:budget:<name>   (see reserve.lua for its fields)
-- Arguments, in order (the prelude's cursor): now ('' for the server's TIME); how long the hash
-- outlives what it holds (ms); 'pause' and the time before which no slot may lie (a later pause
-- already set is kept), 'resume' (the pause is lifted), or 'adapt' (a 429, 5xx or timeout) and the
-- ceiling, decrease, min, step (ppm) and window (ms): the level is multiplied by decrease (not below
-- min) once per window, or 'latency' and a window's latency report (latency.lua's
-- parse_latency_args; 'lat' holds the controller's state; returns {verdict, level before, level
-- after, gradient}), or on a leased budget's pool 'adopt' and its home's 'adapt' state ('' for
-- none), the ceiling, step (ppm) and window (ms): the pool takes it, and where the level in force
-- fell it gives back what it leased and had not booked of every window still open
-- (`give_back_open_leases`).
--
-- Returns the level after the signal (ppm), 0 for a pause, and for a resume the lifted pause's
-- end (-1: there was none).

local key = KEYS[1]
local now = clock(int())

-- A pool gives back what it holds and has not booked of every window of its leases that has not
-- closed (schedule/calendars.rs's give_back_open_leases), lists them for the store to send its
-- home (`returns_listed`, as reserve's give_back_lease does), and forgets that its home was full
-- (and that its windows were booked) from now's window on: its next event asks its home again.
local function give_back_open_leases()
  local all = redis.call('HGETALL', key)
  local fields = {}
  for i = 1, #all, 2 do
    fields[all[i]] = all[i + 1]
  end
  local added, set = {}, {}
  for name, value in pairs(fields) do
    local per, window = string.match(name, '^(%d+):(%-?%d+):l$')
    per, window = tonumber(per), tonumber(window)
    if per and window + per > now then
      local base = per .. ':' .. window
      local spare = tonumber(value) - (tonumber(fields[base .. ':r']) or 0) - (tonumber(fields[base]) or 0)
      if spare > 0 then
        set[#set + 1], set[#set + 2] = base .. ':r', (tonumber(fields[base .. ':r']) or 0) + spare
        added[#added + 1] = base
      end
    end
    local hint, hint_per = string.match(name, '^([FB]):(%d+)$')
    if hint then
      local before = now - now % tonumber(hint_per) - tonumber(hint_per)
      if tonumber(value) > before then
        set[#set + 1], set[#set + 2] = name, before
      end
    end
  end
  set[#set + 1], set[#set + 2] = FIELD_POOL_RETURNS, returns_listed(fields[FIELD_POOL_RETURNS], added, now)
  redis.call('HSET', key, unpack(set))
end
local margin, op = int(), str()

local held = redis.call('HMGET', key, 'pause', 'adapt', 'exp', 'lat')
local needed, level = now + margin, 0
if op == 'resume' then
  if not tonumber(held[1]) then
    return -1
  end
  redis.call('HDEL', key, 'pause')
  return tonumber(held[1])
elseif op == 'pause' then
  local until_ = int()
  if not tonumber(held[1]) or tonumber(held[1]) < until_ then
    redis.call('HSET', key, 'pause', until_)
  end
  needed = math.max(until_, now) + margin
elseif op == 'latency' then
  local c, count, p, calls = parse_latency_args(str())
  local verdict, before, after, gradient, adapt, lat = level_after_latency(held[2], held[4], p, calls, count, c, now)
  if verdict ~= 0 then
    if adapt ~= '' then
      redis.call('HSET', key, 'adapt', adapt)
    end
    redis.call('HSET', key, 'lat', lat)
  end
  needed = math.max(level_matters_until(after, c.ceiling, c.step, c.window, now, true),
    now + LATENCY_MEMORY_WINDOWS * c.window) + margin
  level = {verdict, before, after, gradient}
elseif op == 'adopt' then
  local state, ceiling, step, window = str(), int(), int(), int()
  local before = level_in_force(held[2], ceiling, step, window, now)
  if state == '' then
    redis.call('HDEL', key, 'adapt')
  else
    redis.call('HSET', key, 'adapt', state)
  end
  level = level_in_force(state, ceiling, step, window, now)
  if level < before then
    give_back_open_leases()
  end
  local _, _, by_latency = parse_level(state)
  needed = level_matters_until(level, ceiling, step, window, now, by_latency) + margin
else
  local ceiling, decrease, min, step, window = int(), int(), int(), int(), int()
  local state
  level, state = level_after_signal(held[2], ceiling, decrease, min, step, window, now)
  if state ~= '' then
    redis.call('HSET', key, 'adapt', state)
  end
  needed = level_matters_until(level, ceiling, step, window, now) + margin
end
local exp = tonumber(held[3])
if not exp then
  redis.call('HSET', key, 'exp', needed)
  redis.call('PEXPIRE', key, needed - now)
elseif exp < needed then
  redis.call('HSET', key, 'exp', needed)
  redis.call('PEXPIRE', key, needed - now, 'GT')
end
return level
