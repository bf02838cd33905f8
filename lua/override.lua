-- Set or delete one per-entity limit override, atomically, and keep the overrides hash alive as
-- long as any override in it may still be in force.
--
-- KEYS[1]  the entity's overrides hash   drip:{rule|key}:o
-- ARGV[1]  now, or '' to use the server's TIME
-- ARGV[2]  'set', 'delete', 'pause' (the entity waits until ARGV[5]; a later pause extends it),
--          or 'adapt' (a 429, 5xx or timeout for an adaptive limit: ARGV[4] is
--          'ceiling:decrease:min:step:window', as budget.lua's; 'adapt' holds '<level>:<window
--          number>' and 'adapt:u' when it stops mattering)
-- ARGV[3]  the override id (e.g. fixed:60000)
-- ARGV[4]  the new count (set)           ARGV[5] until, ms since the epoch, or '' (none) (set)
-- ARGV[6]  how long the hash outlives the latest `until`
--
-- Returns the override it replaced: {count, until (-1: none)}, or {} when there was none.

local key, op, id = KEYS[1], ARGV[2], ARGV[3]
local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = time[1] * 1000 + math.floor(time[2] / 1000)
else
  now = tonumber(ARGV[1])
end

local before = redis.call('HMGET', key, id, id .. ':u')
local previous = {}
if before[1] then
  previous = {tonumber(before[1]), tonumber(before[2]) or -1}
end

if op == 'adapt' then
  local ceiling, decrease, min, step, window = string.match(ARGV[4], '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  ceiling, decrease, min, step, window =
    tonumber(ceiling), tonumber(decrease), tonumber(min), tonumber(step), tonumber(window)
  local current = math.floor(now / window)
  local stored, at = string.match(redis.call('HGET', key, 'adapt') or '', '^(%d+):(%-?%d+)$')
  stored, at = tonumber(stored), tonumber(at)
  local level = stored
  if at ~= current then
    level = ceiling
    if stored then
      level = math.min(ceiling, stored + math.max(current - at - 1, 0) * step)
    end
    level = math.max(math.floor(level * decrease / 1000000), min)
    redis.call('HSET', key, 'adapt', level .. ':' .. current)
  end
  redis.call('HSET', key, 'adapt:u', now + (math.ceil((ceiling - level) / step) + 2) * window)
  previous = {level}
elseif op == 'pause' then
  local current = tonumber(redis.call('HGET', key, 'pause'))
  if not current or current < tonumber(ARGV[5]) then
    redis.call('HSET', key, 'pause', ARGV[5])
  end
elseif op == 'set' then
  redis.call('HSET', key, id, ARGV[4])
  if ARGV[5] == '' then
    redis.call('HDEL', key, id .. ':u')
  else
    redis.call('HSET', key, id .. ':u', ARGV[5])
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
  redis.call('PEXPIRE', key, math.max(latest - now, 0) + tonumber(ARGV[6]))
end
return previous
