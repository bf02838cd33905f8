-- Prepended to every script of drip-store (scripts.rs) when it is built: what they share. Before
-- it, scripts.rs writes the numbers Rust and the scripts share (ANSWER_MINUTE, OVERRIDE_MARGIN,
-- REPLY_LENGTH, the LATENCY_* constants of drip-core's budgets.rs), from the Rust constants.
--
-- The arguments are read in order with a cursor, as drip-store's args.rs writes them; a section is
-- a count followed by that many records. No script does offset arithmetic on ARGV.
local arg_at = 0
local function str()
  arg_at = arg_at + 1
  return ARGV[arg_at]
end
-- A number, or nil for '' (none).
local function int()
  arg_at = arg_at + 1
  return tonumber(ARGV[arg_at])
end
-- The next n values, as the bounds of `unpack(ARGV, from, to)` (field names for an HMGET).
local function span(n)
  local from = arg_at + 1
  arg_at = arg_at + n
  return from, arg_at
end

-- The caller's time when it gives one (a simulated clock), else the server's.
local function clock(given)
  if given then
    return given
  end
  local time = redis.call('TIME')
  return time[1] * 1000 + math.floor(time[2] / 1000)
end

-- An answer: '<R|L|C><slot>:<decided>:<held>[:<cost>]', times relative to the answers hash's
-- base; held is the lease's end (relative), 'd' once completed or 'r' once released; then the
-- cost it booked when not 1 (keys.rs: field::completed_answer). A cost reported after the call is
-- kept beside it, in the field named the answer's and CORRECTED (its value: the actual cost).
local function answer_value(kind, slot, decided, held, base, cost)
  local value = kind .. (slot - base) .. ':' .. (decided - base) .. ':' .. held
  if cost ~= 1 then
    return value .. ':' .. cost
  end
  return value
end
-- kind, slot and decided (relative, as text), held, the booked cost.
local function parse_answer(value)
  local kind, slot, decided, held, cost = string.match(value, '^(%a)(%-?%d+):(%-?%d+):(%-?%w+):?(%d*)$')
  return kind, slot, decided, held, tonumber(cost) or 1
end
local CORRECTED = 'c'

-- A count scaled by parts per million (an adaptive level, a fair share), never below the event's
-- cost nor 1: budgets::adapted_count and Budget::share_of in the model.
local function scaled(n, ppm, cost)
  return math.max(math.floor(n * ppm / 1000000), cost, 1)
end

-- An adaptive level (ppm) as stored: '<level>:<window number>', with ':l' when a latency report
-- set it (budgets.rs: AdaptiveState).
local function parse_level(state)
  local level, at, by = string.match(state or '', '^(%d+):(%-?%d+)(:?l?)$')
  return tonumber(level), tonumber(at), by == ':l'
end
-- A stored level at `now`: a step up per quiet window since the window it was set in (past the
-- hold for a latency report's), at most the ceiling (budgets.rs: Adaptive::level).
local function level_grown(level, at, by_latency, ceiling, step, window, now)
  local held = 0
  if by_latency then
    held = LATENCY_HOLD_WINDOWS
  end
  local quiet = math.max(math.floor(now / window) - at - 1 - held, 0)
  return math.min(ceiling, level + quiet * step)
end
-- The level in force at `now`: the last signal's, grown as level_grown says.
local function level_in_force(state, ceiling, step, window, now)
  local level, at, by_latency = parse_level(state)
  if not level then
    return ceiling
  end
  return level_grown(level, at, by_latency, ceiling, step, window, now)
end
-- A 429, 5xx or timeout at `now`: the level drops by `decrease` (not below min) once per window.
-- Returns the level after it and the state to store ('' when it is unchanged).
local function level_after_signal(state, ceiling, decrease, min, step, window, now)
  local stored, at, by_latency = parse_level(state)
  local current = math.floor(now / window)
  if at == current and not by_latency then
    return stored, ''
  end
  local level = ceiling
  if stored then
    level = level_grown(stored, at, by_latency, ceiling, step, window, now)
  end
  level = math.max(math.floor(level * decrease / 1000000), min)
  return level, level .. ':' .. current
end
-- How long a lowered level matters: until it is back at the ceiling (after its hold, when a
-- latency report set it).
local function level_matters_until(level, ceiling, step, window, now, by_latency)
  local held = 0
  if by_latency then
    held = LATENCY_HOLD_WINDOWS
  end
  return now + (held + math.ceil((ceiling - level) / step) + 2) * window
end

-- An entity's overrides live in one field of its state hash, 'o': what `drip limits set`, a
-- pause and an adaptive level leave, as 'name=value' entries joined by ';' (keys.rs:
-- field::overrides): 'pause', 'adapt' ('<level>:<window number>'), 'adapt:u' (when it stops
-- mattering), and per override id (e.g. 'fixed:60000') its count and '<id>:u' its end. Read on
-- the common path only when present; most entities have none.
local OVERRIDES = 'o'

local function parse_overrides(blob)
  local o = {}
  if blob then
    for name, value in string.gmatch(blob, '([^;=]+)=([^;]*)') do
      o[name] = value
    end
  end
  return o
end

local function format_overrides(o)
  local names = {}
  for name in pairs(o) do
    names[#names + 1] = name
  end
  table.sort(names)
  for i = 1, #names do
    names[i] = names[i] .. '=' .. o[names[i]]
  end
  return table.concat(names, ';')
end

-- When the overrides stop mattering: their latest end plus the margin, or true while an override
-- without an end exists; false for none.
local function overrides_keep(o)
  local latest, forever = false, false
  for name, value in pairs(o) do
    if name == 'pause' or string.sub(name, -2) == ':u' then
      local ends = tonumber(value)
      if ends and (not latest or ends > latest) then
        latest = ends
      end
    elseif name ~= 'adapt' and not o[name .. ':u'] then
      forever = true
    end
  end
  if forever then
    return true
  end
  return latest and latest + OVERRIDE_MARGIN
end

-- Sets the TTL of an entity's state hash so that it lives until `expires` (absolute, on the
-- scripts' clock; `now` the same clock) and as long as its overrides matter.
local function expire_entity(key, expires, o, now)
  local keep = overrides_keep(o)
  if keep == true then
    redis.call('PERSIST', key)
    return
  end
  if keep and (not expires or keep > expires) then
    expires = keep
  end
  if expires then
    redis.call('PEXPIRE', key, math.max(expires - now, 1))
  end
end

-- Folds an entity's overrides kept by earlier versions in a hash of their own (drip:{rule|key}:o)
-- into `o` (entries already in `o` are newer and win). Returns whether there was one: the caller
-- deletes that hash once it has written `o`.
local function fold_legacy_overrides(legacy_key, o)
  local fields = redis.call('HGETALL', legacy_key)
  for i = 1, #fields, 2 do
    if o[fields[i]] == nil then
      o[fields[i]] = fields[i + 1]
    end
  end
  return #fields > 0
end

-- Deletes the fields of a calendar hash (a budget's, a pool's, a home's) of the windows of `per`
-- from `lo` (the oldest it may hold) up to before `current`: each window's `<per>:<window>` and
-- the fields `more(name, dead)` adds for it, or after a long gap, every field of such a window
-- found by a scan.
local function drop_windows(key, per, lo, current, more)
  local dead = {}
  if (current - lo) / per <= 64 then
    for window = lo, current - per, per do
      local name = per .. ':' .. window
      dead[#dead + 1] = name
      more(name, dead)
    end
  else
    local prefix = per .. ':'
    for _, field in ipairs(redis.call('HKEYS', key)) do
      if string.sub(field, 1, #prefix) == prefix then
        local window = tonumber(string.match(field, '^%-?%d+', #prefix + 1))
        if window and window < current then
          dead[#dead + 1] = field
        end
      end
    end
  end
  if #dead > 0 then
    redis.call('HDEL', key, unpack(dead))
  end
end

-- A leased budget's pool lists the windows it gave units of back ('R': '<per>:<window>' joined by
-- ','), for the store to send its home (RedisStore::send_returns): `listed` kept to the windows
-- that have not closed at `now`, with each name of `added` (a window still open) in it once.
local function returns_listed(listed, added, now)
  local kept, seen = {}, {}
  for entry in string.gmatch(listed or '', '[^,]+') do
    local p, w = string.match(entry, '^(%d+):(%-?%d+)$')
    if tonumber(w) + tonumber(p) > now then
      kept[#kept + 1], seen[entry] = entry, true
    end
  end
  for i = 1, #added do
    if not seen[added[i]] then
      kept[#kept + 1], seen[added[i]] = added[i], true
    end
  end
  return table.concat(kept, ',')
end
