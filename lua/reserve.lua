-- Reserve the earliest slot for one event of one entity (rule, key) under every limit of its rule.
-- The same arithmetic as drip-core's schedule.rs (the reference model); a differential test keeps
-- them identical. All times are integer milliseconds since the Unix epoch.
--
-- KEYS[1]  the entity's state hash                          drip:{rule|key}:state
-- KEYS[2]  the answers of messages published in one minute   drip:{rule|key}:a:<minute>
-- KEYS[3..] one sorted set per sliding limit, in the order the limits name them
--
-- ARGV[1] now, or '' to use the server's TIME   ARGV[2] the message's answer field (8 bytes of a
--         hash of its identity)                 ARGV[3] cost (1 <= cost <= every limit)
-- ARGV[4] max_delay                             ARGV[5] base: the start of the answers' minute
-- ARGV[6] how long the answers hash outlives max(base, now): a minute + max_delay + a margin
-- ARGV[7] lease: how long the attempt that gets this answer acts alone on the message (0: none)
-- ARGV[8] state TTL beyond the slot (longest window + margin)
-- ARGV[9] number of limits, then six arguments per limit: kind (fixed|spread|sliding|gcra), per,
--         limit, burst (gcra) or KEYS index (sliding), and the names of its two state fields
--         (fixed: window, used; gcra: tat, remainder; sliding: base, unused)
--
-- Returns {slot, late (1 when beyond max_delay: nothing reserved), replayed (1 for a known message), now,
-- decided_at (the now of the first answer), completed (1 once complete.lua marked it acted upon),
-- busy (1 when another attempt holds the message's lease: this one must not act)}.
-- An answer is '<R|L><slot>:<decided_at>:<lease until>' (the lease 'd' once completed, 'r' once
-- released), each time
-- relative to base, so that an in-flight message costs Redis about 30 bytes in a small hash.
-- Work per event is O(limits) (O(log n) per sliding limit): one HMGET, one HSET and one PEXPIRE
-- of the state, one HGET and one HSET of the answer. Lua prints integers below 1e14 exactly, so
-- times need no string.format.

local state_key, answers_key, field = KEYS[1], KEYS[2], ARGV[2]

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = time[1] * 1000 + math.floor(time[2] / 1000)
else
  now = tonumber(ARGV[1])
end

local base, lease = tonumber(ARGV[5]), tonumber(ARGV[7])
local recorded = redis.call('HGET', answers_key, field)
if recorded then
  local kind, slot, decided_at, held = string.match(recorded, '^(%a)(%-?%d+):(%-?%d+):(%-?%w+)$')
  local late = kind == 'L' and 1 or 0
  slot, decided_at = base + slot, base + decided_at
  if held == 'd' then
    return {slot, late, 1, now, decided_at, 1, 0}
  end
  if held ~= 'r' and base + held > now then
    return {slot, late, 1, now, decided_at, 0, 1}
  end
  redis.call('HSET', answers_key, field, kind .. (slot - base) .. ':' .. (decided_at - base) .. ':' .. (now + lease - base))
  return {slot, late, 1, now, decided_at, 0, 0}
end

local function answer(kind, slot)
  redis.call('HSET', answers_key, field, kind .. (slot - base) .. ':' .. (now - base) .. ':' .. (now + lease - base))
  -- Relative, not PEXPIREAT: `now` may be a simulated time, far from the server's clock.
  redis.call('PEXPIRE', answers_key, math.max(base - now, 0) + tonumber(ARGV[6]))
end

local cost = tonumber(ARGV[3])
local count = tonumber(ARGV[9])
local kinds, pers, limits, extras, fa, fb = {}, {}, {}, {}, {}, {}
local wanted = {'last'}
for i = 1, count do
  local at = 4 + i * 6
  kinds[i], pers[i], limits[i], extras[i] = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  fa[i], fb[i] = ARGV[at + 4], ARGV[at + 5]
  wanted[2 * i], wanted[2 * i + 1] = fa[i], fb[i]
end
local values = redis.call('HMGET', state_key, unpack(wanted))
local last = tonumber(values[1])
local a, b = {}, {}
for i = 1, count do
  a[i], b[i] = tonumber(values[2 * i]), tonumber(values[2 * i + 1])
end

-- The last sliding entry's running total of cost, or nil.
local function newest_total(key)
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return tonumber(newest[2])
end

-- The earliest time >= t at which limit i accepts `cost` more.
local function accepted(i, t)
  local kind, per, limit = kinds[i], pers[i], limits[i]
  if kind == 'fixed' or kind == 'spread' then
    local window = t - t % per
    local used = 0
    if a[i] == window then
      used = b[i]
    end
    if used + cost > limit then
      return window + per
    end
    if kind == 'spread' then
      return math.max(t, window + math.floor(used * per / limit))
    end
    return t
  elseif kind == 'sliding' then
    local base = a[i]
    if not base then
      return t
    end
    local key = KEYS[extras[i]]
    local total = newest_total(key) or base
    -- Drop the oldest slots until what is left leaves room for `cost`.
    local threshold = total - (limit - cost)
    if threshold <= base then
      return t
    end
    local first_kept = redis.call('ZRANGEBYSCORE', key, threshold, '+inf', 'LIMIT', 0, 1)
    return math.max(t, tonumber(first_kept[1]) + per)
  else
    local tat = a[i]
    if not tat then
      return t
    end
    local x = b[i] - (extras[i] - 1) * per
    local q = math.floor(x / limit)
    local allowed = tat + q
    if x - q * limit > 0 then
      allowed = allowed + 1
    end
    return math.max(t, allowed)
  end
end

local slot = now
if last and last > now then
  slot = last
end
local settled = false
for _ = 1, count + 2 do
  local next_slot = slot
  for i = 1, count do
    local t = accepted(i, slot)
    if t > next_slot then
      next_slot = t
    end
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

if slot > now + tonumber(ARGV[4]) then
  answer('L', slot)
  return {slot, 1, 0, now, now, 0, 0}
end

local ttl = slot - now + tonumber(ARGV[8])
local changes = {'last', slot}
for i = 1, count do
  local kind, per = kinds[i], pers[i]
  local n = #changes
  if kind == 'fixed' or kind == 'spread' then
    local window = slot - slot % per
    local used = cost
    if a[i] == window then
      used = b[i] + cost
    end
    changes[n + 1], changes[n + 2], changes[n + 3], changes[n + 4] = fa[i], window, fb[i], used
  elseif kind == 'gcra' then
    local tat, rem = a[i], b[i]
    -- A slot this limit set is TAT rounded up to the millisecond; only a later slot restarts TAT.
    if not tat or slot > tat + (rem > 0 and 1 or 0) then
      tat, rem = slot, 0
    end
    rem = rem + cost * per
    local limit = limits[i]
    tat = tat + math.floor(rem / limit)
    rem = rem % limit
    changes[n + 1], changes[n + 2], changes[n + 3], changes[n + 4] = fa[i], tat, fb[i], rem
  else
    local key = KEYS[extras[i]]
    local base = a[i] or 0
    local total = newest_total(key) or base
    -- Members are slot times: a slot equal to the newest one merges into it (its total grows).
    redis.call('ZADD', key, total + cost, slot)
    while true do
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      if not oldest[1] or tonumber(oldest[1]) > slot - per then
        break
      end
      base = tonumber(oldest[2])
      redis.call('ZREM', key, oldest[1])
    end
    changes[n + 1], changes[n + 2] = fa[i], base
    redis.call('PEXPIRE', key, ttl)
  end
end
redis.call('HSET', state_key, unpack(changes))
redis.call('PEXPIRE', state_key, ttl)
answer('R', slot)
return {slot, 0, 0, now, now, 0, 0}
