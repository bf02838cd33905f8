-- Reserve the earliest slot for one event of one entity (rule, key) under every limit of its rule.
-- The same arithmetic as drip-core's schedule.rs (the reference model); a differential test keeps
-- them identical. All times are integer milliseconds since the Unix epoch.
--
-- KEYS[1]  the entity's state hash    drip:{rule|key}:state
-- KEYS[2]  this message's answer      drip:{rule|key}:m:<message id>
-- KEYS[3..] one sorted set per sliding limit, in the order the limits name them
--
-- ARGV[1] now, or '' to use the server's TIME   ARGV[2] cost (1 <= cost <= every limit)
-- ARGV[3] max_delay                             ARGV[4] TTL of the answer record
-- ARGV[5] state TTL beyond the slot (longest window + margin)
-- ARGV[6] lease: how long the attempt that gets this answer acts alone on the message (0: none)
-- ARGV[7] number of limits, then five arguments per limit:
--         kind (fixed|spread|sliding|gcra), state id, per, limit, burst (gcra) or KEYS index (sliding)
--
-- Returns {slot, late (1 when beyond max_delay: nothing reserved), replayed (1 for a known message), now,
-- decided_at (the now of the first answer), completed (1 once complete.lua marked it acted upon),
-- busy (1 when another attempt holds the message's lease: this one must not act)}.
-- A message's answer is kept as '<R|L>:<slot>:<decided_at>:<lease until>', the lease replaced by
-- 'done' once completed (complete.lua).
-- Work per event is O(limits) (O(log n) per sliding limit); state is two numbers per fixed or gcra
-- limit and, per sliding limit, only the slots inside its last period.

local state_key, answer_key = KEYS[1], KEYS[2]

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[1])
end

local function int(n)
  return string.format('%.0f', n)
end

local lease = tonumber(ARGV[6])
local recorded = redis.call('GET', answer_key)
if recorded then
  local kind, slot, decided_at, held = string.match(recorded, '^(%a):(%-?%d+):(%-?%d+):(%w+)$')
  local late = kind == 'L' and 1 or 0
  if held == 'done' then
    return {tonumber(slot), late, 1, now, tonumber(decided_at), 1, 0}
  end
  if tonumber(held) > now then
    return {tonumber(slot), late, 1, now, tonumber(decided_at), 0, 1}
  end
  redis.call('SET', answer_key, kind .. ':' .. slot .. ':' .. decided_at .. ':' .. int(now + lease), 'KEEPTTL')
  return {tonumber(slot), late, 1, now, tonumber(decided_at), 0, 0}
end

local cost = tonumber(ARGV[2])
local max_delay = tonumber(ARGV[3])
local answer_ttl = ARGV[4]
local state_ttl = tonumber(ARGV[5])
local limits = {}
for i = 1, tonumber(ARGV[7]) do
  local at = 8 + (i - 1) * 5
  local limit = {kind = ARGV[at], id = ARGV[at + 1], per = tonumber(ARGV[at + 2]), limit = tonumber(ARGV[at + 3])}
  if limit.kind == 'sliding' then
    limit.key = KEYS[tonumber(ARGV[at + 4])]
  else
    limit.burst = tonumber(ARGV[at + 4])
  end
  limits[i] = limit
end

local flat = redis.call('HGETALL', state_key)
local h = {}
for i = 1, #flat, 2 do
  h[flat[i]] = tonumber(flat[i + 1])
end

-- The last sliding entry: its time and the running total of cost up to it.
local function newest(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[1] then
    return tonumber(last[1]), tonumber(last[2])
  end
  return nil, nil
end

-- The earliest time >= t at which this limit accepts `cost` more.
local function accepted(l, t)
  if l.kind == 'fixed' or l.kind == 'spread' then
    local window = math.floor(t / l.per) * l.per
    local used = 0
    if h[l.id .. ':w'] == window then
      used = h[l.id .. ':u']
    end
    if used + cost > l.limit then
      return window + l.per
    end
    if l.kind == 'spread' then
      return math.max(t, window + math.floor(used * l.per / l.limit))
    end
    return t
  elseif l.kind == 'sliding' then
    local base = h[l.id .. ':b']
    if not base then
      return t
    end
    local _, total = newest(l.key)
    total = total or base
    -- Drop the oldest slots until what is left leaves room for `cost`.
    local threshold = total - (l.limit - cost)
    if threshold <= base then
      return t
    end
    local first_kept = redis.call('ZRANGEBYSCORE', l.key, int(threshold), '+inf', 'LIMIT', 0, 1)
    return math.max(t, tonumber(first_kept[1]) + l.per)
  else
    local tat = h[l.id .. ':t']
    if not tat then
      return t
    end
    local x = h[l.id .. ':r'] - (l.burst - 1) * l.per
    local q = math.floor(x / l.limit)
    local allowed = tat + q
    if x - q * l.limit > 0 then
      allowed = allowed + 1
    end
    return math.max(t, allowed)
  end
end

local slot = now
if h['last'] and h['last'] > now then
  slot = h['last']
end
local settled = false
for _ = 1, #limits + 2 do
  local next_slot = slot
  for _, l in ipairs(limits) do
    next_slot = math.max(next_slot, accepted(l, slot))
  end
  if next_slot == slot then
    settled = true
    break
  end
  slot = next_slot
end
if not settled then
  return redis.error_reply('drip: slot search did not settle')
end

if slot > now + max_delay then
  redis.call('SET', answer_key, 'L:' .. int(slot) .. ':' .. int(now) .. ':' .. int(now + lease), 'PX', answer_ttl)
  return {slot, 1, 0, now, now, 0, 0}
end

local ttl = int(slot - now + state_ttl)
for _, l in ipairs(limits) do
  if l.kind == 'fixed' or l.kind == 'spread' then
    local window = math.floor(slot / l.per) * l.per
    if h[l.id .. ':w'] == window then
      redis.call('HINCRBY', state_key, l.id .. ':u', cost)
    else
      redis.call('HSET', state_key, l.id .. ':w', int(window), l.id .. ':u', cost)
    end
  elseif l.kind == 'gcra' then
    local tat, rem = h[l.id .. ':t'], h[l.id .. ':r']
    -- A slot this limit set is TAT rounded up to the millisecond; only a later slot restarts TAT.
    if not tat or slot > tat + (rem > 0 and 1 or 0) then
      tat, rem = slot, 0
    end
    rem = rem + cost * l.per
    tat = tat + math.floor(rem / l.limit)
    rem = rem % l.limit
    redis.call('HSET', state_key, l.id .. ':t', int(tat), l.id .. ':r', int(rem))
  else
    local base = h[l.id .. ':b'] or 0
    local _, total = newest(l.key)
    total = total or base
    -- Members are slot times: a slot equal to the newest one merges into it (its total grows).
    redis.call('ZADD', l.key, int(total + cost), int(slot))
    while true do
      local oldest = redis.call('ZRANGE', l.key, 0, 0, 'WITHSCORES')
      if not oldest[1] or tonumber(oldest[1]) > slot - l.per then
        break
      end
      base = tonumber(oldest[2])
      redis.call('ZREM', l.key, oldest[1])
    end
    redis.call('HSET', state_key, l.id .. ':b', int(base))
    redis.call('PEXPIRE', l.key, ttl)
  end
end
redis.call('HSET', state_key, 'last', int(slot))
redis.call('PEXPIRE', state_key, ttl)
redis.call('SET', answer_key, 'R:' .. int(slot) .. ':' .. int(now) .. ':' .. int(now + lease), 'PX', answer_ttl)
return {slot, 0, 0, now, now, 0, 0}
