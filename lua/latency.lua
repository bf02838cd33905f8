-- Included after the prelude by the scripts that take latency reports (override.lua, budget.lua),
-- so that reserve.lua does not build these functions on every call.
--
-- The latency controller (budgets.rs: Adaptive::after_latency, the same integer steps). Its state,
-- 'lat': '<baseline µs>:<level that hurt>:<level after that cut>:<busy healthy windows since>:<window of
-- the report that decided>:<its level>'. `p` is a window's high percentile (µs) over `calls`
-- calls; `count` the configured count of the limit that sets the window; `c` the parameters.
-- Returns the verdict (0 a repeat, 1 slow, 2 grew, 3 held, 4 lagging), the level before and after, the
-- gradient (ppm), the adaptive state to store ('' for none) and the latency state.
local function trunc(x)
  if x < 0 then
    return math.ceil(x)
  end
  return math.floor(x)
end
local function cubic_climb(hurt, cut, grown, step, recover)
  local span = math.max(math.max(hurt - cut, 0), step)
  local k = math.max(recover, 1)
  local function curve(t)
    local d = t - k
    return trunc(span * d * d * d / (k * k * k))
  end
  return math.max(curve(grown) - curve(grown - 1), 0)
end
local function level_after_latency(adapt, lat, p, calls, count, c, now)
  local current = math.floor(now / c.window)
  local baseline, hurt, cut, grown, at, own
  if lat then
    baseline, hurt, cut, grown, at, own = string.match(lat, '^(%d+):(%d+):(%d+):(%d+):(%-?%d+):(%d+)$')
    baseline, hurt, cut, grown, at, own =
      tonumber(baseline), tonumber(hurt), tonumber(cut), tonumber(grown), tonumber(at), tonumber(own)
  end
  local before
  if c.shadow then
    before = level_in_force(baseline and (own .. ':' .. at .. ':l'), c.ceiling, c.step, c.window, now)
  else
    before = level_in_force(adapt, c.ceiling, c.step, c.window, now)
  end
  if at == current then
    return 0, before, before, 1000000, '', lat
  end
  local seen = math.min(math.max(p, 1), LATENCY_MAX_US)
  local previous = baseline or seen
  local gradient = math.min(math.max(math.floor(c.tolerance * math.max(previous, LATENCY_FLOOR_US) / seen), 500000), 1000000)
  if seen < previous then
    baseline = seen
  elseif gradient < 1000000 and before > c.min then
    baseline = previous
  else
    baseline = previous + math.floor((seen - previous) * c.weight / 1000000)
  end
  hurt, cut, grown = hurt or 0, cut or 0, grown or 0
  local after, verdict
  if gradient < 1000000 and calls > math.floor(count * before / 1000000) then
    after, verdict = before, 4
  elseif gradient < 1000000 then
    after = math.max(before - math.floor((before - math.floor(before * gradient / 1000000)) * c.smoothing / 1000000), c.min)
    hurt, cut, grown, verdict = before, after, 0, 1
  elseif calls >= math.floor(math.floor(count * before / 1000000) * LATENCY_BUSY / 1000000) then
    grown = math.min(grown + 1, LATENCY_MAX_CLIMB * c.recover)
    local climb = c.step
    if hurt ~= 0 then
      climb = cubic_climb(hurt, cut, grown, c.step, c.recover)
    end
    after, verdict = math.min(before + climb, c.ceiling), 2
    if after == c.ceiling then
      hurt, cut, grown = 0, 0, 0
    end
  else
    after, verdict = before, 3
  end
  local state = ''
  if not c.shadow then
    state = after .. ':' .. current .. ':l'
  end
  return verdict, before, after, gradient, state,
    table.concat({baseline, hurt, cut, grown, current, after}, ':')
end
-- The parameters of a latency report, 'ceiling:decrease:min:step:window:tolerance:smoothing:
-- baseline:recover:shadow(0/1):count:percentile:calls' (drip-store's latency_args).
local function parse_latency_args(value)
  local n = {}
  for part in string.gmatch(value, '[^:]+') do
    n[#n + 1] = tonumber(part)
  end
  return {ceiling = n[1], decrease = n[2], min = n[3], step = n[4], window = n[5], tolerance = n[6],
    smoothing = n[7], weight = n[8], recover = n[9], shadow = n[10] == 1}, n[11], n[12], n[13]
end
