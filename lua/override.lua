-- Set or delete one per-entity limit override, pause or lift a pause, or lower an adaptive level,
-- atomically, in the overrides field of the entity's state hash (the prelude's OVERRIDES), and
-- keep the hash alive as long as any of them may still be in force.
--
-- KEYS[1]  the entity's state hash          drip:{rule|key}:state
--          (for a rule with classes, the calendar its key's classes share: drip:{rule|key}:classes,
--          whose overrides every class books against; reserve.lua reads them as the calendar's 'o')
-- KEYS[2]  where earlier versions kept its overrides (folded in, then deleted)   drip:{rule|key}:o
-- Arguments, in order (the prelude's cursor): now ('' for the server's TIME); the operation: 'set',
-- 'delete', 'pause' (the entity waits until `until`; a later pause extends it), 'resume' (the
-- pause is lifted; returns {its end} or {} when there was none), 'adapt' (a 429,
-- 5xx or timeout for an adaptive limit: the value is 'ceiling:decrease:min:step:window', as
-- budget.lua's; 'adapt' holds '<level>:<window number>' and 'adapt:u' when it stops mattering), or
-- 'latency' (a window's latency report: the value is latency.lua's parse_latency_args; 'lat' holds
-- the controller's state; returns {verdict, level before, level after, gradient});
-- the override id (e.g. fixed:60000); the value (set: the new count); until (ms since the epoch,
-- or '' for none).
--
-- Returns the override it replaced: {count, until (-1: none)}, or {} when there was none.

local key = KEYS[1]
local now = clock(int())
local op, id, value, until_ = str(), str(), str(), str()

local held = redis.call('HMGET', key, OVERRIDES, 'exp')
local o = parse_overrides(held[1])
if fold_legacy_overrides(KEYS[2], o) then
  redis.call('DEL', KEYS[2])
end

local previous = {}
if o[id] then
  previous = {tonumber(o[id]), tonumber(o[id .. ':u']) or -1}
end

if op == 'latency' then
  local c, count, p, calls = parse_latency_args(value)
  local verdict, before, after, gradient, adapt, lat = level_after_latency(o.adapt, o.lat, p, calls, count, c, now)
  if verdict ~= 0 then
    if adapt ~= '' then
      o.adapt = adapt
      o['adapt:u'] = level_matters_until(after, c.ceiling, c.step, c.window, now, true)
    end
    o.lat = lat
    o['lat:u'] = now + LATENCY_MEMORY_WINDOWS * c.window
  end
  previous = {verdict, before, after, gradient}
elseif op == 'adapt' then
  local ceiling, decrease, min, step, window = string.match(value, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  ceiling, decrease, min, step, window =
    tonumber(ceiling), tonumber(decrease), tonumber(min), tonumber(step), tonumber(window)
  local level, state = level_after_signal(o.adapt, ceiling, decrease, min, step, window, now)
  if state ~= '' then
    o.adapt = state
  end
  o['adapt:u'] = level_matters_until(level, ceiling, step, window, now)
  previous = {level}
elseif op == 'pause' then
  local current = tonumber(o.pause)
  if not current or current < tonumber(until_) then
    o.pause = until_
  end
elseif op == 'resume' then
  local current = tonumber(o.pause)
  previous = {}
  if current then
    o.pause = nil
    previous = {current}
  end
elseif op == 'set' then
  o[id] = value
  o[id .. ':u'] = (until_ ~= '' and until_) or nil
else
  o[id], o[id .. ':u'] = nil, nil
end

local blob = format_overrides(o)
if blob == '' then
  redis.call('HDEL', key, OVERRIDES)
else
  redis.call('HSET', key, OVERRIDES, blob)
end
expire_entity(key, tonumber(held[2]), o, now)
return previous
