-- Reserve the earliest slot for one event of one entity (rule, key) under every limit of its rule.
-- The same arithmetic as drip-core's schedule.rs (the reference model); a differential test keeps
-- them identical. All times are integer milliseconds since the Unix epoch.
--
-- KEYS[1]  the entity's state hash                          drip:{rule|key}:state
-- KEYS[2]  the answers of messages published in one minute   drip:{rule|key}:a:<minute>
-- KEYS[3]  the entity's overrides (drip limits set)            drip:{rule|key}:o
-- KEYS[4..] one sorted set per sliding limit, in the order the limits name them, then one hash per
--          shared budget the event draws from                 drip:{b:<tag>}:budget:<name>
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
--         then a floor for the entity's frontier ('' for none: see `previous_key` in schedule.rs);
--         then the entity's adaptive limit: its ceiling (ppm; '' for none), step (ppm), window (ms);
--         then the delivery margin (ms: no slot in a fixed window's last margin, sliding intervals
--         per + margin long; see schedule.rs); then the number of budgets, and for each: its KEYS index, adaptive ceiling ('' for none),
--         step, window, max_share (ppm, '' for none), its number of limits, and for each limit:
--         per, count, 'fixed' or 'spread'.
-- A limit of kind 'share' is a budget's fair share (a fixed window on the entity's own slots): its
-- count is the budget limit's count in force times max_share, its fourth argument the budget's
-- number in the list above.
-- A budget's hash holds 'pause', 'adapt' ('<level>:<window number>'), 'exp' (when its TTL was
-- last set to end), 'lo:<per>' (the oldest window of that limit it may hold), 'run:<per>'
-- ('<from>:<through>:<least>', the limit's run of full windows: schedule.rs's FullRun) and
-- '<per>:<window>' (the cost reserved in that window): a calendar, since entities reserve its
-- windows out of order.
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

-- The adaptive level in force (budgets.rs): the last signal's, a step up per quiet window since.
local function level_of(state, ceiling, step, window)
  if not state then
    return ceiling
  end
  local level, at = string.match(state, '^(%d+):(%-?%d+)$')
  local quiet = math.max(math.floor(now / window) - tonumber(at) - 1, 0)
  return math.min(ceiling, tonumber(level) + quiet * step)
end
local function adapted(base, level)
  return math.max(math.floor(base * level / 1000000), cost, 1)
end

local extra = params + 6 * count + 2
local horizon = now + tonumber(ARGV[4])
local margin = tonumber(ARGV[extra + 3])
local budget_count = tonumber(ARGV[extra + 4])
local budgets = {}
local at = extra + 5
for b = 1, budget_count do
  local key, ceiling = KEYS[tonumber(ARGV[at])], tonumber(ARGV[at + 1])
  local limit_count = tonumber(ARGV[at + 5])
  local fields = {'pause', 'adapt', 'exp'}
  for j = 1, limit_count do
    fields[3 + j] = 'lo:' .. ARGV[at + 3 + 3 * j]
    fields[3 + limit_count + j] = 'run:' .. ARGV[at + 3 + 3 * j]
  end
  local held = redis.call('HMGET', key, unpack(fields))
  local level = ceiling and level_of(held[2], ceiling, tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]))
  local budget_limits = {}
  for j = 1, limit_count do
    local p = at + 3 + 3 * j
    local n = tonumber(ARGV[p + 1])
    if cost > n then
      answer('C', now)
      return {now, 2, 0, now, now, 0, 0}
    end
    if level then
      n = adapted(n, level)
    end
    local run
    if held[3 + limit_count + j] then
      local from, through, least = string.match(held[3 + limit_count + j], '^(%-?%d+):(%-?%d+):(%d+)$')
      run = {from = tonumber(from), through = tonumber(through), least = tonumber(least)}
    end
    budget_limits[j] = {per = tonumber(ARGV[p]), n = n, spread = ARGV[p + 2] == 'spread', lo = tonumber(held[3 + j]),
      run = run, used = {}}
  end
  budgets[b] = {key = key, pause = tonumber(held[1]), exp = tonumber(held[3]), level = level,
    share = tonumber(ARGV[at + 4]), limits = budget_limits}
  at = at + 6 + 3 * limit_count
end

-- The count of each limit in force now: the rule's, or the entity's override until its end, at
-- the adaptive level if the rule has one. The first fields are 'pause' (the downstream asked to
-- wait until then: a 429 or 503 with Retry-After) and 'adapt' (the adaptive level's state).
local overrides = redis.call('HMGET', KEYS[3], 'pause', 'adapt', unpack(ARGV, params + 4 * count, params + 6 * count - 1))
local paused_until = tonumber(overrides[1])
local entity_ceiling = tonumber(ARGV[extra])
local entity_level = entity_ceiling and level_of(overrides[2], entity_ceiling, tonumber(ARGV[extra + 1]), tonumber(ARGV[extra + 2]))
local limits = {}
for i = 1, count do
  local at = params + (i - 1) * 4
  local kind, limit = ARGV[at], tonumber(ARGV[at + 2])
  if kind == 'share' then
    local budget = budgets[tonumber(ARGV[at + 3])]
    if budget.level then
      limit = adapted(limit, budget.level)
    end
    limit = math.max(math.floor(limit * budget.share / 1000000), cost, 1)
  else
    local override = tonumber(overrides[2 * i + 1])
    if override then
      local ends = tonumber(overrides[2 * i + 2])
      if not ends or now < ends then
        limit = override
      end
    end
    -- A gcra limit lets at most `burst` units out at once (whatever its rate): a larger cost can
    -- never conform. A window never holds more than its count.
    if (kind == 'gcra' and cost > tonumber(ARGV[at + 3])) or (kind ~= 'gcra' and cost > limit) then
      answer('C', now)
      return {now, 2, 0, now, now, 0, 0}
    end
    if entity_level and kind ~= 'gcra' then
      limit = adapted(limit, entity_level)
    end
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
for b = 1, budget_count do
  if budgets[b].pause and budgets[b].pause > slot then
    slot = budgets[b].pause
  end
end
-- The least common fixpoint of every limit's "earliest time >= t it accepts cost more" (see
-- schedule.rs): each of the entity's limits moves the slot forward at most once, so count + 1
-- rounds settle it; a budget's calendar may move it again, never past the horizon.
-- Written inline, without closures or per-limit tables: each costs the script time per call.
local settled = false
local rounds = count + 2
if budget_count > 0 then
  rounds = 100000
end
for _ = 1, rounds do
  local next_slot = slot
  for i = 1, count do
    local at = params + (i - 1) * 4
    local kind, per, limit = ARGV[at], tonumber(ARGV[at + 1]), limits[i]
    local a, b = tonumber(values[2 * i + 2]), tonumber(values[2 * i + 3])
    local t = slot
    if kind == 'fixed' or kind == 'spread' or kind == 'share' then
      local window = t - t % per
      if t >= window + per - margin then
        window = window + per
        t = window
      end
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
        t = math.max(t, window + math.floor(used * (per - margin) / limit))
      end
    elseif kind == 'sliding' then
      if a then
        local key = KEYS[tonumber(ARGV[at + 3])]
        local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        -- Drop the oldest slots until what is left leaves room for `cost`.
        local threshold = (tonumber(newest[2]) or a) - (limit - cost)
        if threshold > a then
          local first_kept = redis.call('ZRANGEBYSCORE', key, threshold, '+inf', 'LIMIT', 0, 1)
          t = math.max(t, tonumber(first_kept[1]) + per + margin)
        end
      elseif last then
        t = math.max(t, last + per + margin)
      end
    elseif a then
      -- An event of cost c waits until c units conform: TAT - (burst - c) * T (schedule.rs).
      local x = b - (tonumber(ARGV[at + 3]) - cost) * per
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
  -- Each budget limit: the first window from the slot's with room (a window past the horizon ends
  -- the search: the event is late whatever that window holds), jumping over the limit's run of
  -- full windows when the cost cannot fit beside what they hold; what it walks updates the run
  -- exactly as schedule.rs's budget_accepts does.
  for b = 1, budget_count do
    local key = budgets[b].key
    for _, l in ipairs(budgets[b].limits) do
      local per, n, run = l.per, l.n, l.run
      local window = slot - slot % per
      local t = slot
      if t >= window + per - margin then
        window = window + per
        t = window
      end
      local jumpable = run and run.least + cost > n
      local walked_from, walked_through, walked_least, jumped
      while true do
        if window > horizon then
          t = math.max(t, window)
          break
        end
        if jumpable and window >= run.from and window <= run.through then
          window, jumped = run.through + per, true
        else
          local used = l.used[window]
          if not used then
            used = tonumber(redis.call('HGET', key, per .. ':' .. window)) or 0
            l.used[window] = used
          end
          if used + cost <= n then
            if l.spread then
              t = math.max(t, window + math.floor(used * (per - margin) / n))
            else
              t = math.max(t, window)
            end
            break
          end
          if not walked_from then
            walked_from, walked_least = window, used
          elseif used < walked_least then
            walked_least = used
          end
          walked_through = window
          window = window + per
        end
      end
      if walked_from then
        local kept
        if not run then
          kept = {from = walked_from, through = walked_through, least = walked_least}
        elseif jumped then
          if walked_least >= run.least then
            kept = {from = math.min(walked_from, run.from), through = math.max(walked_through, run.through), least = run.least}
          end
        elseif run.through < now - now % per or run.least + cost <= n or walked_from < run.from then
          kept = {from = walked_from, through = walked_through, least = walked_least}
        elseif walked_from == run.through + per and walked_least >= run.least then
          kept = {from = run.from, through = walked_through, least = run.least}
        end
        if kept then
          l.run, l.run_changed = kept, true
        end
      end
      if t > next_slot then
        next_slot = t
      end
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

-- The runs of full windows the search changed, as HSET arguments of each budget's hash.
local function changed_runs(budget)
  local set = {}
  for _, l in ipairs(budget.limits) do
    if l.run_changed then
      set[#set + 1], set[#set + 2] = 'run:' .. l.per, l.run.from .. ':' .. l.run.through .. ':' .. l.run.least
    end
  end
  return set
end

if slot > now + tonumber(ARGV[4]) then
  -- Nothing is reserved, but what the search walked is kept: the next search jumps over it.
  for b = 1, budget_count do
    local set = changed_runs(budgets[b])
    if #set > 0 then
      redis.call('HSET', budgets[b].key, unpack(set))
    end
  end
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
  if kind == 'fixed' or kind == 'spread' or kind == 'share' then
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
      if not oldest[1] or tonumber(oldest[1]) > slot - per - margin then
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
-- Each budget: the slot's window of each limit takes the cost; windows before now's are dropped
-- (no slot is ever placed before now); the hash outlives its latest window by the state TTL.
for b = 1, budget_count do
  local budget = budgets[b]
  local key = budget.key
  local set = changed_runs(budget)
  for _, l in ipairs(budget.limits) do
    local per = l.per
    redis.call('HINCRBY', key, per .. ':' .. (slot - slot % per), cost)
    local current = now - now % per
    if l.lo and l.lo < current then
      local dead = {}
      if (current - l.lo) / per <= 64 then
        for window = l.lo, current - per, per do
          dead[#dead + 1] = per .. ':' .. window
        end
      else
        local prefix = per .. ':'
        for _, name in ipairs(redis.call('HKEYS', key)) do
          if string.sub(name, 1, #prefix) == prefix and tonumber(string.sub(name, #prefix + 1)) < current then
            dead[#dead + 1] = name
          end
        end
      end
      if #dead > 0 then
        redis.call('HDEL', key, unpack(dead))
      end
    end
    if not l.lo or l.lo < current then
      set[#set + 1], set[#set + 2] = 'lo:' .. per, current
    end
  end
  if not budget.exp or budget.exp < slot + state_ttl then
    set[#set + 1], set[#set + 2] = 'exp', slot + 2 * state_ttl
  end
  if #set > 0 then
    redis.call('HSET', key, unpack(set))
  end
  if not budget.exp then
    redis.call('PEXPIRE', key, slot + 2 * state_ttl - now)
  elseif budget.exp < slot + state_ttl then
    -- GT: a pause or an adaptive level (budget.lua) may need it to live longer.
    redis.call('PEXPIRE', key, slot + 2 * state_ttl - now, 'GT')
  end
end
answer('R', answers_expiry_set)
return {slot, 0, 0, now, now, 0, 0}
