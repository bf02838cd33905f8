-- Reserve the earliest slot for one event of one entity (rule, key) under every limit of its rule.
-- The same arithmetic as drip-core's schedule.rs (the reference model); a differential test keeps
-- them identical. All times are integer milliseconds since the Unix epoch.
--
-- KEYS[1]  the entity's state hash                          drip:{rule|key}:state
-- KEYS[2]  the answers of messages published in one minute   drip:{rule|key}:a:<minute>
-- KEYS[3]  the entity's overrides (drip limits set)            drip:{rule|key}:o
-- KEYS[4..] one sorted set per sliding limit, in the order the limits name them
--
-- ARGV[1] now, or '' to use the server's TIME   ARGV[2] the message's answer field (8 bytes of a
--         hash of its identity)                 ARGV[3] cost (1 <= cost <= every limit)
-- ARGV[4] max_delay                             ARGV[5] base: the start of the answers' minute
-- ARGV[6] how long the answers hash outlives max(base, now): a minute + max_delay + a margin
-- ARGV[7] lease: how long the attempt that gets this answer acts alone on the message (0: none)
-- ARGV[8] state TTL beyond the slot (longest window + margin)
-- ARGV[9] number of limits; ARGV[10..12] 'last', 'exp', 'ab', then two state field names per limit (fixed: window,
--         used; gcra: tat, remainder; sliding: base, unused); then four arguments per limit: kind
--         (fixed|spread|sliding|gcra), per, limit, and burst (gcra) or its KEYS index (sliding); then
--         two override field names per limit (its count, its until); then 'reslot' to give a message
--         that has an answer a new slot (the attempt holding its lease was told to wait), else '';
--         then a floor for the entity's frontier ('' for none: see `previous_key` in schedule.rs)
--
-- Returns {slot, late (1 when beyond max_delay, 2 when the cost is over a limit in force: nothing
-- reserved), replayed (1 for a known message), now,
-- decided_at (the now of the first answer), completed (1 once complete.lua marked it acted upon),
-- busy (1 when another attempt holds the message's lease: this one must not act)}.
-- An answer is '<R|L><slot>:<decided_at>:<lease until>' (the lease 'd' once completed, 'r' once
-- released), each time
-- relative to base, so that an in-flight message costs Redis about 30 bytes in a small hash.
-- Work per event is O(limits) (O(log n) per sliding limit): one HMGET, one HSET and one PEXPIRE
-- of the state, one HGET and one HSET of the answer. Lua prints integers below 1e14 exactly, so
-- times need no string.format.

local state_key, answers_key, field = KEYS[1], KEYS[2], ARGV[2]
-- The answers' minute: drip-store's ANSWER_BUCKET (a test keeps them equal).
local ANSWER_MINUTE = 60000

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = time[1] * 1000 + math.floor(time[2] / 1000)
else
  now = tonumber(ARGV[1])
end

local base, lease = tonumber(ARGV[5]), tonumber(ARGV[7])
local count = tonumber(ARGV[9])
local params = 13 + 2 * count
local reslot = ARGV[params + 6 * count] == 'reslot'
local recorded = not reslot and redis.call('HGET', answers_key, field)
if recorded then
  local kind, slot, decided_at, held = string.match(recorded, '^(%a)(%-?%d+):(%-?%d+):(%-?%w+)$')
  local late = (kind == 'L' and 1) or (kind == 'C' and 2) or 0
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
-- ARGV[10 .. 12 + 2 * count] are the state fields; the limits' parameters follow. 'exp' is when the
-- state was last set to expire and 'ab' the answers minute whose expiry is set, so that most calls
-- need neither PEXPIRE: every redis.call costs the script about as much as its own arithmetic.
local values = redis.call('HMGET', state_key, unpack(ARGV, 10, 12 + 2 * count))
local last, expires, answers_expiry_set = tonumber(values[1]), tonumber(values[2]), tonumber(values[3]) == base
local floor = tonumber(ARGV[params + 6 * count + 1])
if floor and (not last or floor > last) then
  last = floor
end

-- The count of each limit in force now: the rule's, or the entity's override until its end.
-- The first field is 'pause': the downstream asked to wait until then (a 429 or 503 with Retry-After).
local overrides = redis.call('HMGET', KEYS[3], 'pause', unpack(ARGV, params + 4 * count, params + 6 * count - 1))
local paused_until = tonumber(overrides[1])
local limits = {}
for i = 1, count do
  local limit = tonumber(ARGV[params + (i - 1) * 4 + 2])
  local override = tonumber(overrides[2 * i])
  if override then
    local ends = tonumber(overrides[2 * i + 1])
    if not ends or now < ends then
      limit = override
    end
  end
  if cost > limit then
    answer('C', now)
    return {now, 2, 0, now, now, 0, 0}
  end
  limits[i] = limit
end

local slot = now
if last and last > now then
  slot = last
end
if paused_until and paused_until > slot then
  slot = paused_until
end
-- The least common fixpoint of every limit's "earliest time >= t it accepts cost more" (see
-- schedule.rs): each limit moves the slot forward at most once, so count + 1 rounds settle it.
-- Written inline, without closures or per-limit tables: each costs the script time per call.
local settled = false
for _ = 1, count + 2 do
  local next_slot = slot
  for i = 1, count do
    local at = params + (i - 1) * 4
    local kind, per, limit = ARGV[at], tonumber(ARGV[at + 1]), limits[i]
    local a, b = tonumber(values[2 * i + 2]), tonumber(values[2 * i + 3])
    local t = slot
    if kind == 'fixed' or kind == 'spread' then
      local window = t - t % per
      local used = 0
      if a == window then
        used = b
      elseif not a and last and last - last % per == window then
        -- A limit gained by a rule edit counts as full up to the frontier (schedule.rs).
        used = limit
      end
      if used + cost > limit then
        t = window + per
      elseif kind == 'spread' then
        t = math.max(t, window + math.floor(used * per / limit))
      end
    elseif kind == 'sliding' then
      if a then
        local key = KEYS[tonumber(ARGV[at + 3])]
        local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        -- Drop the oldest slots until what is left leaves room for `cost`.
        local threshold = (tonumber(newest[2]) or a) - (limit - cost)
        if threshold > a then
          local first_kept = redis.call('ZRANGEBYSCORE', key, threshold, '+inf', 'LIMIT', 0, 1)
          t = math.max(t, tonumber(first_kept[1]) + per)
        end
      elseif last then
        t = math.max(t, last + per)
      end
    elseif a then
      local x = b - (tonumber(ARGV[at + 3]) - 1) * per
      local q = math.floor(x / limit)
      local allowed = a + q
      if x - q * limit > 0 then
        allowed = allowed + 1
      end
      t = math.max(t, allowed)
    elseif last then
      t = math.max(t, last + math.floor((per + limit - 1) / limit))
    end
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

-- The answers hash expires a minute + max_delay + a margin after its minute (or after now, for a
-- message first delivered later): once set in its minute, that covers every answer of the minute.
local function answer(kind, expiry_set)
  redis.call('HSET', answers_key, field, kind .. (slot - base) .. ':' .. (now - base) .. ':' .. (now + lease - base))
  if not (expiry_set and now <= base + ANSWER_MINUTE) then
    -- Relative, not PEXPIREAT: `now` may be a simulated time, far from the server's clock.
    redis.call('PEXPIRE', answers_key, math.max(base - now, 0) + tonumber(ARGV[6]))
  end
end

if slot > now + tonumber(ARGV[4]) then
  answer('L', false)
  return {slot, 1, 0, now, now, 0, 0}
end

local state_ttl = tonumber(ARGV[8])
local ttl = slot - now + state_ttl
local changes = {'last', slot, 'ab', base}
for i = 1, count do
  local at = params + (i - 1) * 4
  local kind, per = ARGV[at], tonumber(ARGV[at + 1])
  local a, b = tonumber(values[2 * i + 2]), tonumber(values[2 * i + 3])
  local fa, fb = ARGV[11 + 2 * i], ARGV[12 + 2 * i]
  local n = #changes
  if kind == 'fixed' or kind == 'spread' then
    local window = slot - slot % per
    local used = cost
    if a == window then
      used = b + cost
    end
    changes[n + 1], changes[n + 2], changes[n + 3], changes[n + 4] = fa, window, fb, used
  elseif kind == 'gcra' then
    local tat, rem = a, b
    -- A slot this limit set is TAT rounded up to the millisecond; only a later slot restarts TAT.
    if not tat or slot > tat + (rem > 0 and 1 or 0) then
      tat, rem = slot, 0
    end
    local limit = limits[i]
    rem = rem + cost * per
    tat = tat + math.floor(rem / limit)
    rem = rem % limit
    changes[n + 1], changes[n + 2], changes[n + 3], changes[n + 4] = fa, tat, fb, rem
  else
    local key = KEYS[tonumber(ARGV[at + 3])]
    local base_cost = a or 0
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local total = tonumber(newest[2]) or base_cost
    -- Members are slot times: a slot equal to the newest one merges into it (its total grows).
    redis.call('ZADD', key, total + cost, slot)
    while true do
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      if not oldest[1] or tonumber(oldest[1]) > slot - per then
        break
      end
      base_cost = tonumber(oldest[2])
      redis.call('ZREM', key, oldest[1])
    end
    changes[n + 1], changes[n + 2] = fa, base_cost
    redis.call('PEXPIRE', key, ttl)
  end
end
-- The state must outlive the slot by its TTL margin; it is given twice that when it is set, so
-- that most calls need no PEXPIRE.
if not expires or expires < slot + state_ttl then
  changes[#changes + 1], changes[#changes + 2] = 'exp', slot + 2 * state_ttl
  redis.call('HSET', state_key, unpack(changes))
  redis.call('PEXPIRE', state_key, ttl + state_ttl)
else
  redis.call('HSET', state_key, unpack(changes))
end
answer('R', answers_expiry_set)
return {slot, 0, 0, now, now, 0, 0}
