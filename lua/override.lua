-- Set or delete one per-entity limit override, atomically, and keep the overrides hash alive as
-- long as any override in it may still be in force.
--
-- KEYS[1]  the entity's overrides hash   drip:{rule|key}:o
-- Arguments, in order (the prelude's cursor): now ('' for the server's TIME); the operation: 'set',
-- 'delete', 'pause' (the entity waits until `until`; a later pause extends it), 'resume' (the
-- pause is lifted; returns {its end} or {} when there was none), or 'adapt' (a 429,
-- 5xx or timeout for an adaptive limit: the value is 'ceiling:decrease:min:step:window', as
-- budget.lua's; 'adapt' holds '<level>:<window number>' and 'adapt:u' when it stops mattering);
-- the override id (e.g. fixed:60000); the value (set: the new count); until (ms since the epoch,
-- or '' for none); how long the hash outlives the latest `until`.
--
-- Returns the override it replaced: {count, until (-1: none)}, or {} when there was none.

local key = KEYS[1]
local now = clock(int())
local op, id, value, until_, margin = str(), str(), str(), str(), int()

local before = redis.call('HMGET', key, id, id .. ':u')
local previous = {}
if before[1] then
  previous = {tonumber(before[1]), tonumber(before[2]) or -1}
end

if op == 'adapt' then
  local ceiling, decrease, min, step, window = string.match(value, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  ceiling, decrease, min, step, window =
    tonumber(ceiling), tonumber(decrease), tonumber(min), tonumber(step), tonumber(window)
  local level, state = level_after_signal(redis.call('HGET', key, 'adapt'), ceiling, decrease, min, step, window, now)
  if state ~= '' then
    redis.call('HSET', key, 'adapt', state)
  end
  redis.call('HSET', key, 'adapt:u', level_matters_until(level, ceiling, step, window, now))
  previous = {level}
elseif op == 'pause' then
  local current = tonumber(redis.call('HGET', key, 'pause'))
  if not current or current < tonumber(until_) then
    redis.call('HSET', key, 'pause', until_)
  end
elseif op == 'resume' then
  local current = tonumber(redis.call('HGET', key, 'pause'))
  previous = {}
  if current then
    redis.call('HDEL', key, 'pause')
    previous = {current}
  end
elseif op == 'set' then
  redis.call('HSET', key, id, value)
  if until_ == '' then
    redis.call('HDEL', key, id .. ':u')
  else
    redis.call('HSET', key, id .. ':u', until_)
  end
else
  redis.call('HDEL', key, id, id .. ':u')
end

-- No TTL while an override without an end exists; else until the latest end plus the margin.
local fields = redis.call('HGETALL', key)
local latest, forever = nil, false
for i = 1, #fields, 2 do
  local name = fields[i]
  if name == 'adapt' then
    -- Its end is 'adapt:u'.
  elseif name == 'pause' or string.sub(name, -2) == ':u' then
    local ends = tonumber(fields[i + 1])
    if not latest or ends > latest then
      latest = ends
    end
  elseif redis.call('HEXISTS', key, name .. ':u') == 0 then
    forever = true
  end
end
if forever then
  redis.call('PERSIST', key)
elseif latest then
  redis.call('PEXPIRE', key, math.max(latest - now, 0) + margin)
end
return previous
