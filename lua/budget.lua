-- Feedback on a shared budget: pause it, or lower its adaptive level (AIMD), atomically.
--
-- KEYS[1]  the budget's hash   drip:{b:<tag>}:budget:<name>   (see reserve.lua for its fields)
-- ARGV[1]  now, or '' to use the server's TIME
-- ARGV[2]  how long the hash outlives what it holds (ms)
-- ARGV[3]  'pause': no slot before ARGV[4] (a later pause already set is kept)
--          'adapt': a 429, 5xx or timeout: ARGV[4..8] ceiling, decrease, min, step (ppm) and the
--          window (ms); the level is multiplied by decrease (not below min) once per window
--
-- Returns the level after the signal (ppm), or 0 for a pause.

local key, op = KEYS[1], ARGV[3]
local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = time[1] * 1000 + math.floor(time[2] / 1000)
else
  now = tonumber(ARGV[1])
end
local margin = tonumber(ARGV[2])

local held = redis.call('HMGET', key, 'pause', 'adapt', 'exp')
local needed, level = now + margin, 0
if op == 'pause' then
  local until_ = tonumber(ARGV[4])
  if not tonumber(held[1]) or tonumber(held[1]) < until_ then
    redis.call('HSET', key, 'pause', until_)
  end
  needed = math.max(until_, now) + margin
else
  local ceiling, decrease, min, step, window =
    tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  local current = math.floor(now / window)
  local stored, at
  if held[2] then
    stored, at = string.match(held[2], '^(%d+):(%-?%d+)$')
    stored, at = tonumber(stored), tonumber(at)
  end
  if at == current then
    level = stored
  else
    level = ceiling
    if stored then
      level = math.min(ceiling, stored + math.max(current - at - 1, 0) * step)
    end
    level = math.max(math.floor(level * decrease / 1000000), min)
    redis.call('HSET', key, 'adapt', level .. ':' .. current)
  end
  -- It matters until the level is back at the ceiling.
  needed = now + (math.ceil((ceiling - level) / step) + 2) * window + margin
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
