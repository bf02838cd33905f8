-- Reserve the earliest slot for each of one or more events, one after another in order, under every
-- limit of its rule. The same arithmetic as drip-core's schedule.rs (the reference model); a
-- differential test keeps them identical. All times are integer milliseconds since the Unix epoch.
--
-- Arguments (drip-store's args.rs writes them; the prelude's cursor reads them): now ('' for the
-- server's TIME), then a section of events. Each event names where its keys start in KEYS (its
-- entity's state hash drip:{rule|key}:state, then the answers of messages published in one minute
-- drip:{rule|key}:a:<minute>, where earlier versions kept the entity's overrides drip:{rule|key}:o,
-- one sorted set per sliding limit, one hash per shared budget drip:{b:<tag>}:budget:<name>), then
-- its own fields: see `read_event`. All keys of one call share a hash slot.
--
-- The entity's state hash is everything the common path reads, in one HMGET: its frontier 'f',
-- when its TTL was last set to end 'exp', the answers minute whose expiry is set 'ab', each limit's
-- two fields, and its overrides, pause and adaptive level in one field (the prelude's OVERRIDES);
-- 'last' is the frontier as earlier versions named it (an entity they wrote is carried over on its
-- next reservation). A message's answer is written with HSETNX before anything else is, so that
-- the common path reads nothing more: a message the hash already knows gets its first answer back.
--
-- A limit of kind 'share' is a budget's fair share (a fixed window on the entity's own slots): its
-- count is the budget limit's count in force times max_share, its extra the budget's number.
-- A budget's hash holds 'pause', 'adapt' ('<level>:<window number>'), 'exp' (when its TTL was
-- last set to end), 'lo:<per>' (the oldest window of that limit it may hold), 'run:<per>'
-- ('<from>:<through>:<least>', the limit's run of full windows: schedule.rs's FullRun) and
-- '<per>:<window>' (the cost reserved in that window): a calendar, since entities reserve its
-- windows out of order. A rule's classes calendar (one per key) also holds the key's overrides of
-- the rule's limits ('o', override.lua's) and 'c', the last slot of what the key booked before the
-- rule had classes, once it carried that over (carry_over).
--
-- Returns, for each event in order, the five numbers `reply` builds: slot, status (STATUS), what
-- the attempt may do (ATTEMPT), now and decided_at (the now of the first answer). An answer is the
-- prelude's codec, so
-- that an in-flight message costs Redis about 30 bytes in a small hash. Work per event is
-- O(limits) (O(log n) per sliding limit, and a budget's calendar walked about once per window).
-- Lua prints integers below 1e14 exactly, so times need no string.format.

-- Within one call, each hash is read once and written once, however many of its events the call
-- holds: an entity's state and overrides (key -> {from, to, values}: the fields as this call left
-- them), the messages' answers (answers key -> field -> answer, or false for none), and the writes
-- still to make (key -> {fields, order, ttl}), made when the call ends.
local reads, answers, writes
-- An entity's overrides when it has none (never written to).
local NO_OVERRIDES = {}

-- HMGET of ARGV[from..to], or what this call read (and changed) of the same fields before.
local function hmget(key, from, to)
  local cached = reads[key]
  if cached and cached.to - cached.from == to - from then
    local same, offset = true, cached.from - from
    for i = from, to do
      if ARGV[i] ~= ARGV[i + offset] then
        same = false
        break
      end
    end
    if same then
      return cached.values
    end
  end
  local values = redis.call('HMGET', key, unpack(ARGV, from, to))
  reads[key] = {from = from, to = to, values = values}
  return values
end

-- Sets the fields `changes` (name, value, ...) of hash `key` when the call ends; `ttl`: a PEXPIRE
-- after (the longest asked for).
local function write_hash(key, changes, ttl)
  local pending = writes[key]
  if not pending then
    pending = {fields = {}, order = {}, ttl = false}
    writes[key] = pending
  end
  for i = 1, #changes, 2 do
    local name = changes[i]
    if pending.fields[name] == nil then
      pending.order[#pending.order + 1] = name
    end
    pending.fields[name] = changes[i + 1]
  end
  if ttl and (not pending.ttl or ttl > pending.ttl) then
    pending.ttl = ttl
  end
end

local function flush_writes()
  for key, pending in pairs(writes) do
    local set = {}
    for i = 1, #pending.order do
      local name = pending.order[i]
      set[2 * i - 1], set[2 * i] = name, pending.fields[name]
    end
    if #set > 0 then
      redis.call('HSET', key, unpack(set))
    end
    if pending.ttl then
      redis.call('PEXPIRE', key, pending.ttl)
    end
  end
  writes = {}
end

-- Where an event's entity state and message answer are read and written: the storage its
-- arithmetic sees, chosen once per event by `share`. PLAIN goes straight to Redis (an event alone
-- with its hashes: the call's tables would cost more than they save); CACHED goes through the
-- call's reads and writes above, so that the call's next event of the same entity or answers hash
-- sees what this one left.
local PLAIN_STATE, CACHED_STATE = {}, {}

-- The entity's state fields (ARGV[state_from..state_to]), as the call left them.
function PLAIN_STATE.read(e)
  return redis.call('HMGET', KEYS[e.base], unpack(ARGV, e.state_from, e.state_to))
end

function CACHED_STATE.read(e)
  return hmget(KEYS[e.base], e.state_from, e.state_to)
end

-- Sets the state fields `changes` (name, value, ...); `ttl`: a PEXPIRE after, or false.
function PLAIN_STATE.write(e, changes, ttl)
  if #changes > 0 then
    redis.call('HSET', KEYS[e.base], unpack(changes))
  end
  if ttl then
    redis.call('PEXPIRE', KEYS[e.base], ttl)
  end
end

function CACHED_STATE.write(e, changes, ttl)
  write_hash(KEYS[e.base], changes, ttl)
end

local PLAIN_ANSWERS, CACHED_ANSWERS = {}, {}

-- The message's answer if this call read it ahead (`share`), else false: nothing to ask Redis.
function PLAIN_ANSWERS.ahead()
  return false
end

function CACHED_ANSWERS.ahead(e)
  return answers[KEYS[e.base + 1]][e.field]
end

-- The message's answer (false for none), and the value of the field `also` of its answers hash
-- when asked, in one read.
function PLAIN_ANSWERS.get(e, also)
  if also then
    local held = redis.call('HMGET', KEYS[e.base + 1], e.field, also)
    return held[1], held[2]
  end
  return redis.call('HGET', KEYS[e.base + 1], e.field)
end

function CACHED_ANSWERS.get(e, also)
  local key = KEYS[e.base + 1]
  return answers[key][e.field], also and redis.call('HGET', key, also)
end

-- Sets the message's answer `value`, replacing any (`ttl`: a PEXPIRE of the answers hash after).
function PLAIN_ANSWERS.set(e, value, ttl)
  local key = KEYS[e.base + 1]
  redis.call('HSET', key, e.field, value)
  if ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end

function CACHED_ANSWERS.set(e, value, ttl)
  local key = KEYS[e.base + 1]
  write_hash(key, {e.field, value}, ttl)
  answers[key][e.field] = value
end

-- Files the message's first answer: false (and nothing written) when it has one already. The
-- plain way asks Redis with HSETNX, so a new message costs no read of its answer; a cached
-- hash's answers were read ahead, so `decide` has replayed a known one before it gets here.
function PLAIN_ANSWERS.file(e, value, ttl)
  local key = KEYS[e.base + 1]
  if redis.call('HSETNX', key, e.field, value) == 0 then
    return false
  end
  if ttl then
    redis.call('PEXPIRE', key, ttl)
  end
  return true
end

function CACHED_ANSWERS.file(e, value, ttl)
  CACHED_ANSWERS.set(e, value, ttl)
  return true
end

-- Chooses each event's storage: CACHED for an entity or answers hash another event of the call
-- shares. Reads the shared answers hashes' fields with one HMGET each.
local function share(events)
  local states, wanted, order = {}, {}, {}
  for i = 1, #events do
    local e = events[i]
    local state, key = KEYS[e.base], KEYS[e.base + 1]
    states[state] = (states[state] or 0) + 1
    local fields = wanted[key]
    if not fields then
      fields = {}
      wanted[key], order[#order + 1] = fields, key
    end
    fields[#fields + 1] = e.field
  end
  for i = 1, #events do
    local e = events[i]
    if states[KEYS[e.base]] > 1 then
      e.state = CACHED_STATE
    end
    if #wanted[KEYS[e.base + 1]] > 1 then
      e.answers = CACHED_ANSWERS
    end
  end
  for i = 1, #order do
    local key = order[i]
    local fields = wanted[key]
    if #fields > 1 then
      local values = redis.call('HMGET', key, unpack(fields))
      local known = {}
      for j = 1, #fields do
        known[fields[j]] = values[j]
      end
      answers[key] = known
    end
  end
end

-- One event's fields, in the order args.rs writes them. Every table is built whole (a field added
-- later costs a rehash), and field names come as spans of ARGV for HMGET.
local function read_event()
  -- A fixed record, each field at the place args.rs names (the EVENT_* names, numbers once built), read
  -- without a call per value (a call costs the script 0.1 µs each).
  local at = span(EVENT_RECORD) - 1
  -- '' (reserve), 'keep' or 'give' (a new slot, the old one kept or given back), 'correct', or
  -- 'unpark' (the drain of the key's parked messages, at this one).
  local mode = ARGV[at + EVENT_MODE]
  local e = {base = tonumber(ARGV[at + EVENT_FIRST_KEY]), field = ARGV[at + EVENT_ANSWER_FIELD],
    cost = tonumber(ARGV[at + EVENT_COST]), max_delay = tonumber(ARGV[at + EVENT_MAX_DELAY]),
    answers_base = tonumber(ARGV[at + EVENT_ANSWERS_BASE]), answers_keep = tonumber(ARGV[at + EVENT_ANSWERS_KEEP]),
    lease = tonumber(ARGV[at + EVENT_LEASE]), state_ttl = tonumber(ARGV[at + EVENT_STATE_KEEP]),
    reslot = mode == 'keep' or mode == 'give', gives_back = mode == 'give', correct = mode == 'correct',
    unpark = mode == 'unpark', park = tonumber(ARGV[at + EVENT_PARK]) or false, level = false,
    floor = tonumber(ARGV[at + EVENT_FLOOR]) or false,
    margin = tonumber(ARGV[at + EVENT_MARGIN]), ceiling = tonumber(ARGV[at + ADAPTIVE_CEILING]) or false,
    step = tonumber(ARGV[at + ADAPTIVE_STEP]), window = tonumber(ARGV[at + ADAPTIVE_WINDOW]),
    limits = {}, budgets = {}, paused_until = false, state_from = 0, state_to = 0, overrides = false,
    folded = false, state = PLAIN_STATE, answers = PLAIN_ANSWERS}
  local limits = e.limits
  for i = 1, int() do
    at = span(LIMIT_RECORD) - 1
    limits[i] = {kind = ARGV[at + LIMIT_KIND], per = tonumber(ARGV[at + LIMIT_PER]),
      n = tonumber(ARGV[at + LIMIT_COUNT]), extra = tonumber(ARGV[at + LIMIT_EXTRA]),
      id = ARGV[at + LIMIT_OVERRIDE_ID], count = 0}
  end
  -- STATE_FIELDS: 'f', 'exp', 'ab', each limit's two state fields, 'q' and 'wk' (its parked
  -- messages and its drain's wake), the overrides, 'last'.
  e.state_from, e.state_to = span(7 + 2 * #limits)
  local budgets = e.budgets
  for b = 1, int() do
    local budget = {key = int(), ceiling = int() or false, step = int(), window = int(), share = int(),
      leased = int() == 1, per_key = int() == 1, carry_key = false, index = b, limits = {}, floors = {},
      own_floor = false, pause = false, exp = false, level = false, hash = false, overridden = false}
    if budget.per_key then
      -- Where the key's own state is (what it booked before the rule had classes): carry_over.
      budget.carry_key = int()
    end
    local budget_limits = budget.limits
    for j = 1, int() do
      budget_limits[j] = {per = int(), n = int(), spread = str() == 'spread', lo = false, run = false,
        run_changed = false, used = false, parts = false, leased = false, full = false, top = false,
        share = false, counts = true}
    end
    if budget.per_key then
      -- The key's fair share of each budget limit (schedule.rs's budget_limits): one more limit of
      -- its calendar, its count read off that budget (which and its limit) once it is read; it
      -- books nothing itself when a limit of its period counts the same windows (counts 0).
      for _ = 1, int() do
        budget_limits[#budget_limits + 1] = {per = int(), n = 0, spread = false, lo = false, run = false,
          run_changed = false, used = false, parts = false, leased = false, full = false, top = false,
          share = {budget = int(), limit = int(), id = str()}, counts = int() == 1}
      end
    end
    -- Rules holding a floor: name, share in ppm, and whether it is this event's rule.
    local floors = budget.floors
    for k = 1, int() do
      floors[k] = {rule = str(), ppm = int()}
      if int() == 1 then
        budget.own_floor = k
      end
    end
    -- 'pause', 'adapt', 'exp', then each limit's 'lo:<per>' and 'run:<per>'; a leased budget's pool
    -- then each limit's 'F:<per>', 'T:<per>' and 'B:<per>'; a classes calendar then its key's
    -- overrides ('o') and the last slot of the backlog it carried over ('c').
    local per_limit = 2
    if budget.leased then
      per_limit = 5
    end
    local calendar = 0
    if budget.per_key then
      calendar = 2
    end
    budget.fields_from, budget.fields_to = span(3 + per_limit * #budget_limits + calendar)
    budgets[b] = budget
  end
  return e
end

-- An answer's kind as its reply's status (redis_store.rs's parse_reply): reserved, beyond
-- max_delay, cost over a limit in force (nothing reserved for the last two).
-- P: parked (nothing reserved; the message waits in its key's queue). An unpark's reply may
-- also be LATER (its slot is past the drain's deadline), NOT_PARKED or NOT_HEAD.
local STATUS = {R = 0, L = 1, C = 2, W = 3, P = 4}
local LATER, NOT_PARKED, NOT_HEAD = 5, 6, 7
-- What the attempt that asked may do: act on a new decision, act on the message's earlier answer
-- (its lease taken again), not act (another attempt holds the lease), or nothing (acted upon).
local ATTEMPT = {decided = 0, resumed = 1, busy = 2, done = 3}

-- One event's reply: the only place one is built.
local function reply(slot, kind, attempt, now, decided_at)
  return {slot, STATUS[kind], attempt, now, decided_at}
end

-- An event that needs a lease first (its call stops at it, nothing of it written but a new slot's
-- give-back): the window, W, which budget and limit of the event (budget * 256 + limit), the
-- units its partition is about to use of the window, and now.
local function lease_wanted(e, now)
  local wanted = e.wanted
  return {wanted.window, STATUS.W, wanted.budget * 256 + wanted.limit, wanted.demand, now}
end

-- The answer a message already has: its reply, with its lease taken again unless it is held or done.
local function replay(e, recorded, now)
  local kind, slot, decided_at, held, cost = parse_answer(recorded)
  local base = e.answers_base
  slot, decided_at = base + slot, base + decided_at
  if held == 'd' then
    return reply(slot, kind, ATTEMPT.done, now, decided_at)
  end
  if held ~= 'r' and base + held > now then
    return reply(slot, kind, ATTEMPT.busy, now, decided_at)
  end
  e.answers.set(e, answer_value(kind, slot, decided_at, now + e.lease - base, base, cost), false)
  return reply(slot, kind, ATTEMPT.resumed, now, decided_at)
end

-- A classes calendar met for the first time takes over what its key booked before the rule had
-- classes (schedule.rs's carry_over): each limit's latest window from the key's own state, where it
-- has not closed, and the key's last slot, after which every class books. Returns that slot (0:
-- none), which the calendar keeps in 'c'.
local function carry_over(e, budget, now)
  -- The calendar's limits, then each period only a share counts: its fair share's state.
  local names, limits = {'f'}, {}
  for j = 1, #budget.limits do
    local l = budget.limits[j]
    if not l.share or l.counts then
      local id = (l.share and l.share.id) or ('fixed:' .. l.per)
      limits[#limits + 1] = l
      names[2 * #limits], names[2 * #limits + 1] = id .. ':w', id .. ':u'
    end
  end
  local key = KEYS[e.base + budget.carry_key]
  local before = redis.call('HMGET', key, unpack(names))
  -- What an earlier event of this call (from before a rule reload) left for the end of the call.
  local pending = writes[key]
  if pending then
    for i = 1, #names do
      if pending.fields[names[i]] ~= nil then
        before[i] = pending.fields[names[i]]
      end
    end
  end
  local carried = tonumber(before[1]) or 0
  for j = 1, #limits do
    local per, window, used = limits[j].per, tonumber(before[2 * j]), tonumber(before[2 * j + 1])
    if window and used and used > 0 and window + per > now then
      redis.call('HINCRBY', budget.hash, per .. ':' .. window, used)
    end
  end
  redis.call('HSET', budget.hash, 'c', carried)
  if not budget.exp and not budget.overridden then
    redis.call('PEXPIRE', budget.hash, math.max(carried, now) + 2 * e.state_ttl - now)
  end
  return carried
end

-- Each budget's hash as the search needs it: pause, adaptive level in force, expiry, and per limit
-- its oldest window and run of full windows. Returns false when the cost is over a budget limit.
local function read_budgets(e, now)
  local budgets = e.budgets
  for b = 1, #budgets do
    local budget = budgets[b]
    budget.hash = KEYS[e.base + budget.key]
    local count = #budget.limits
    local held = redis.call('HMGET', budget.hash, unpack(ARGV, budget.fields_from, budget.fields_to))
    budget.pause, budget.exp = tonumber(held[1]) or false, tonumber(held[3]) or false
    budget.level = budget.ceiling and level_in_force(held[2], budget.ceiling, budget.step, budget.window, now)
    -- A classes calendar's override of a limit (its id is 'fixed:<per>': the calendar's limits are
    -- fixed windows) replaces the limit's count until its end.
    local o = budget.per_key and parse_overrides(held[#held - 1])
    -- Overrides keep the hash alive (override.lua's expire_entity): an expiry set here only extends.
    budget.overridden = o and next(o) ~= nil
    if budget.per_key then
      local carried = tonumber(held[#held]) or carry_over(e, budget, now)
      if carried > 0 and (not e.floor or carried > e.floor) then
        e.floor = carried
      end
    end
    for j = 1, count do
      local l = budget.limits[j]
      local override = not l.share and o and tonumber(o['fixed:' .. l.per])
      if override then
        local ends = tonumber(o['fixed:' .. l.per .. ':u'])
        if not ends or now < ends then
          l.n = override
        end
      end
      if not l.share and e.cost > l.n then
        return false
      end
      if budget.level and not l.share then
        l.n = math.max(math.floor(l.n * budget.level / 1000000), e.cost, 1)
      end
      l.lo, l.used, l.parts = tonumber(held[3 + j]) or false, {}, {}
      if budget.leased then
        l.leased, l.full, l.top = {}, tonumber(held[3 + 2 * count + j]) or false, tonumber(held[3 + 3 * count + j]) or false
        l.booked, l.booked_changed = tonumber(held[3 + 4 * count + j]) or false, false
      end
      local run = l.counts and held[3 + count + j]
      if run then
        local from, through, least = string.match(run, '^(%-?%d+):(%-?%d+):(%d+)$')
        l.run = {from = tonumber(from), through = tonumber(through), least = tonumber(least)}
      end
    end
  end
  -- A class's key's shares: each from its budget's count in force (schedule.rs's share_of).
  for b = 1, #budgets do
    local limits = budgets[b].limits
    for j = 1, #limits do
      local share = limits[j].share
      if share then
        local from = budgets[share.budget]
        local n = math.max(math.floor(from.limits[share.limit].n * from.share / 1000000), e.cost, 1)
        limits[j].n = n
      end
    end
  end
  return true
end

-- The count of each limit in force now: the rule's, or the entity's override until its end, at the
-- adaptive level if the rule has one; a budget's share from its count in force. Returns false
-- when the cost is over one of them. `e.overrides` (the prelude's parse_overrides) holds 'pause'
-- (the downstream asked to wait until then), 'adapt' (the adaptive level's state) and the
-- overrides by id.
local function counts_in_force(e, now)
  local o = e.overrides
  e.paused_until = tonumber(o.pause) or false
  local level = e.ceiling and level_in_force(o.adapt, e.ceiling, e.step, e.window, now)
  e.level = level
  local limits = e.limits
  for i = 1, #limits do
    local l = limits[i]
    local limit = l.n
    if l.kind == 'share' then
      local budget = e.budgets[l.extra]
      if budget.level then
        limit = math.max(math.floor(limit * budget.level / 1000000), e.cost, 1)
      end
      limit = math.max(math.floor(limit * budget.share / 1000000), e.cost, 1)
    else
      local override = tonumber(o[l.id])
      if override then
        local ends = tonumber(o[l.id .. ':u'])
        if not ends or now < ends then
          limit = override
        end
      end
      -- A gcra limit lets at most `burst` units out at once (whatever its rate): a larger cost can
      -- never conform. A window never holds more than its count.
      if (l.kind == 'gcra' and e.cost > l.extra) or (l.kind ~= 'gcra' and e.cost > limit) then
        return false
      end
      if level and l.kind ~= 'gcra' then
        limit = math.max(math.floor(limit * level / 1000000), e.cost, 1)
      end
    end
    l.count = limit
  end
  return true
end

-- The slot of the message's answer and the cost it holds (the booked one, or the one reported
-- after the call), if it holds one: a message given a new slot, whose new answer starts afresh
-- (the reported cost is dropped).
local function old_slot(e)
  local recorded, corrected = e.answers.get(e, e.field .. CORRECTED)
  local kind, slot, _, _, cost = parse_answer(recorded or '')
  if corrected then
    redis.call('HDEL', KEYS[e.base + 1], e.field .. CORRECTED)
  end
  if kind ~= 'R' then
    return nil
  end
  return e.answers_base + tonumber(slot), tonumber(corrected) or cost
end

-- Moves `delta` units into (positive) or out of (negative) the window of `slot` of each budget
-- limit where it has not closed (schedule.rs's shift_budget_windows): out only of start-placed
-- windows, never below zero, and a run of full windows it lies in keeps only what it now holds.
-- A window up to the pool's booked hint gained room (a credit, a give-back): the hint ends before it.
local function lower_booked(key, per, window)
  local booked = tonumber(redis.call('HGET', key, 'B:' .. per))
  if booked and window <= booked then
    redis.call('HSET', key, 'B:' .. per, window - per)
  end
end

-- A pool gives up to `units` of a window's lease back (schedule.rs's give_back_lease): what its
-- lease holds beyond what it booked, at most; 'R' lists the windows with returns, which the store
-- sends the home after the call (RedisStore::send_returns, lua/returns.lua).
local function give_back_lease(key, per, window, units, now)
  local name = per .. ':' .. window
  local held = redis.call('HMGET', key, name, name .. ':l', name .. ':r', 'R')
  local spare = (tonumber(held[2]) or 0) - (tonumber(held[3]) or 0) - (tonumber(held[1]) or 0)
  units = math.min(units, spare)
  if units <= 0 then
    return
  end
  redis.call('HINCRBY', key, name .. ':r', units)
  -- The list keeps the windows that have not closed.
  local listed, kept = false, {}
  for entry in string.gmatch(held[4] or '', '[^,]+') do
    local p, w = string.match(entry, '^(%d+):(%-?%d+)$')
    if entry == name then
      listed = true
    end
    if tonumber(w) + tonumber(p) > now then
      kept[#kept + 1] = entry
    end
  end
  if not listed then
    kept[#kept + 1] = name
  end
  redis.call('HSET', key, 'R', table.concat(kept, ','))
end

local function shift_budgets(e, slot, now, delta)
  for j = 1, #e.budgets do
    local budget = e.budgets[j]
    for k = 1, #budget.limits do
      local l = budget.limits[k]
      local per = l.per
      local window = slot - slot % per
      if l.counts and window + per > now and not (delta < 0 and l.spread) then
        local name = per .. ':' .. window
        local before = tonumber(redis.call('HGET', budget.hash, name))
        if before then
          local used = math.max(before + delta, 0)
          redis.call('HSET', budget.hash, name, used)
          if budget.own_floor and not l.share then
            local part = name .. ':f:' .. budget.floors[budget.own_floor].rule
            local held = tonumber(redis.call('HGET', budget.hash, part))
            if held then
              redis.call('HSET', budget.hash, part, math.max(held + delta, 0))
            end
          end
          -- Read again when the search needs it (with the floors' parts).
          l.used[window] = nil
          if delta < 0 and budget.leased then
            lower_booked(budget.hash, per, window)
            l.booked = false
            give_back_lease(budget.hash, per, window, before - used, now)
          end
          local run = l.run
          if delta < 0 and run and window >= run.from and window <= run.through and used < run.least then
            run.least = used
            redis.call('HSET', budget.hash, 'run:' .. per, run.from .. ':' .. run.through .. ':' .. used)
          end
        end
      end
    end
  end
end

-- Gives `cost` units of the slot `old` back (schedule.rs's give_back), wherever the window
-- that holds them has not closed and can take them back exactly: the entity's fixed (start)
-- windows and fair shares when the slot lies in the window it holds, budgets' start-placed
-- windows; gcra and sliding only when it is the entity's latest slot (`last`). Written at once:
-- they stand whatever the new decision.
local function give_back(e, values, last, now, old, cost)
  local latest, limits, changes = last == old, e.limits, {}
  for i = 1, #limits do
    local l = limits[i]
    local kind, per = l.kind, l.per
    local a, b = tonumber(values[2 * i + 2]), tonumber(values[2 * i + 3])
    local fa, fb = ARGV[e.state_from + 1 + 2 * i], ARGV[e.state_from + 2 + 2 * i]
    if (kind == 'fixed' or kind == 'share') and a == old - old % per and a + per > now then
      local used = math.max(b - cost, 0)
      values[2 * i + 3] = used
      changes[#changes + 1], changes[#changes + 2] = fb, used
    elseif kind == 'gcra' and latest and a then
      -- TAT - cost * T, exactly: its remainder is in units of 1/count ms.
      local d = b - cost * per
      local tat, rem = a + math.floor(d / l.count), d % l.count
      values[2 * i + 2], values[2 * i + 3] = tat, rem
      changes[#changes + 1], changes[#changes + 2], changes[#changes + 3], changes[#changes + 4] = fa, tat, fb, rem
    elseif kind == 'sliding' and latest and a then
      local key = KEYS[e.base + 2 + l.extra]
      local newest = redis.call('ZRANGE', key, -2, -1, 'WITHSCORES')
      local n = #newest
      if n >= 2 and tonumber(newest[n - 1]) == old then
        local before = (n == 4 and tonumber(newest[2])) or a
        local total = tonumber(newest[n]) - cost
        if total <= before then
          redis.call('ZREM', key, newest[n - 1])
        else
          redis.call('ZADD', key, total, newest[n - 1])
        end
      end
    end
  end
  e.state.write(e, changes, false)
  shift_budgets(e, old, now, -cost)
end

-- Charges `more` units to `slot`'s windows (schedule.rs's charge): the entity's fixed windows and
-- fair shares when the slot lies in the window it holds, budgets' windows that have not closed, a
-- gcra limit's TAT, a sliding limit's newest slot.
local function charge(e, values, now, slot, more)
  local limits, changes = e.limits, {}
  for i = 1, #limits do
    local l = limits[i]
    local kind, per = l.kind, l.per
    local a, b = tonumber(values[2 * i + 2]), tonumber(values[2 * i + 3])
    local fa, fb = ARGV[e.state_from + 1 + 2 * i], ARGV[e.state_from + 2 + 2 * i]
    if (kind == 'fixed' or kind == 'spread' or kind == 'share') and a == slot - slot % per then
      values[2 * i + 3] = b + more
      changes[#changes + 1], changes[#changes + 2] = fb, b + more
    elseif kind == 'gcra' and a then
      local rem = b + more * per
      local tat = a + math.floor(rem / l.count)
      rem = rem % l.count
      values[2 * i + 2], values[2 * i + 3] = tat, rem
      changes[#changes + 1], changes[#changes + 2], changes[#changes + 3], changes[#changes + 4] = fa, tat, fb, rem
    elseif kind == 'sliding' and a then
      local key = KEYS[e.base + 2 + l.extra]
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if newest[1] then
        redis.call('ZADD', key, tonumber(newest[2]) + more, newest[1])
      end
    end
  end
  e.state.write(e, changes, false)
  shift_budgets(e, slot, now, more)
end

-- The window of `t` and `t` itself, or, when `t` lies in the window's last `margin`, the next
-- window and its start (schedule.rs's outside_margin).
local function outside_margin(t, per, margin)
  local window = t - t % per
  if t >= window + per - margin then
    return window + per, window + per
  end
  return window, t
end

-- The earliest time >= t at which one of the entity's limits accepts the cost more (schedule.rs's
-- earliest_accepted); `a`, `b` its two state fields, `last` the entity's frontier.
local function limit_accepts(e, l, a, b, last, t)
  local kind, per, limit, cost, margin = l.kind, l.per, l.count, e.cost, e.margin
  if kind == 'fixed' or kind == 'spread' or kind == 'share' then
    local window
    window, t = outside_margin(t, per, margin)
    local used = 0
    if a == window then
      used = b
    elseif not a and last and last - last % per == window then
      -- A limit gained by a rule edit counts as full up to the frontier (schedule.rs).
      used = limit
    end
    if used + cost > limit then
      return window + per
    elseif kind == 'spread' then
      return math.max(t, window + math.floor(used * (per - margin) / limit))
    end
    return t
  elseif kind == 'sliding' then
    if a then
      local key = KEYS[e.base + 2 + l.extra]
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      -- Drop the oldest slots until what is left leaves room for `cost`.
      local threshold = (tonumber(newest[2]) or a) - (limit - cost)
      if threshold > a then
        local first_kept = redis.call('ZRANGEBYSCORE', key, threshold, '+inf', 'LIMIT', 0, 1)
        return math.max(t, tonumber(first_kept[1]) + per + margin)
      end
    elseif last then
      return math.max(t, last + per + margin)
    end
    return t
  elseif a then
    -- An event of cost c waits until c units conform: TAT - (burst - c) * T (schedule.rs).
    local x = b - (l.extra - cost) * per
    local q = math.floor(x / limit)
    local allowed = a + q
    if x - q * limit > 0 then
      allowed = allowed + 1
    end
    return math.max(t, allowed)
  elseif last then
    return math.max(t, last + math.floor((per + limit - 1) / limit))
  end
  return t
end

-- What a budget window holds: its cost, and each floor's part of it (false without floors).
local function window_use(budget, l, window)
  local used = l.used[window]
  if used then
    return used, l.parts[window]
  end
  local name, floors = l.per .. ':' .. window, budget.floors
  local parts = false
  if #floors == 0 or l.share then
    used = tonumber(redis.call('HGET', budget.hash, name)) or 0
  else
    local names = {name}
    for k = 1, #floors do
      names[k + 1] = name .. ':f:' .. floors[k].rule
    end
    local held = redis.call('HMGET', budget.hash, unpack(names))
    used, parts = tonumber(held[1]) or 0, {}
    for k = 1, #floors do
      parts[k] = tonumber(held[k + 1]) or 0
    end
  end
  l.used[window], l.parts[window] = used, parts
  return used, parts
end

-- Whether a window holding `used` (`parts` by floor) takes `cost` more (schedule.rs's
-- window_takes): never past the count; before the window starts, what the cost takes beyond its
-- rule's unused floor must leave every other floor's unused units free.
local function window_takes(budget, n, used, parts, cost, started)
  if used + cost > n then
    return false
  end
  local floors = budget.floors
  if started or #floors == 0 or not parts then
    return true
  end
  local unused, own_unused = 0, 0
  for k = 1, #floors do
    local left = math.max(math.floor(n * floors[k].ppm / 1000000) - parts[k], 0)
    unused = unused + left
    if k == budget.own_floor then
      own_unused = left
    end
  end
  local borrowed = math.max(cost - own_unused, 0)
  return borrowed == 0 or used + unused + borrowed <= n
end

-- A pool's window of a leased budget limit: what the partition booked of it and what it was leased.
local function pool_use(budget, l, window)
  local used = l.used[window]
  if used then
    return used, l.leased[window]
  end
  local name = l.per .. ':' .. window
  local held = redis.call('HMGET', budget.hash, name, name .. ':l', name .. ':r')
  used = tonumber(held[1]) or 0
  -- What it gave back of the lease is no longer its to book (`give_back_lease`).
  local leased = (tonumber(held[2]) or 0) - (tonumber(held[3]) or 0)
  l.used[window], l.leased[window] = used, leased
  return used, leased
end

-- The earliest time >= slot at which a partition's pool of a leased budget limit accepts the cost
-- more (schedule.rs's pool_accepts): the first window whose lease has room; false, with the window
-- in e.wanted, when a window lacks room and its home was not known to be full there.
--
-- 'B:<per>' (l.booked) only speeds the walk up: every window up to it has no room at all (booked to
-- its lease, or leased out by the home to others), so a walk jumps past it; a walk that met only
-- such windows from there on moves it up to the window before the one it takes; a credit or a
-- give-back into a window up to it moves it down (`lower_booked`).
local function pool_accepts(e, budget, l, j, slot, horizon, now)
  local per, cost = l.per, e.cost
  local window, t = outside_margin(slot, per, e.margin)
  -- Whether every window from now's up to this one is known to have no room at all (up to the
  -- booked hint), so that a walk from here that meets only such windows may move the hint up.
  local known = now - now % per - per
  if l.booked and l.booked > known then
    known = l.booked
  end
  local empty = window <= known + per
  if l.booked and window <= l.booked then
    window = l.booked + per
  end
  while true do
    if window > horizon then
      return math.max(t, window)
    end
    local used, leased = pool_use(budget, l, window)
    if used + cost <= leased then
      if empty and window - per > known then
        l.booked, l.booked_changed = window - per, true
      end
      return math.max(t, window)
    end
    empty = empty and used >= leased
    if not l.full or window > l.full then
      -- About what the partition will use of it (schedule.rs's pool_demand): what it booked of the
      -- window before, less what it holds of this one.
      local before = pool_use(budget, l, window - per)
      e.wanted = {budget = budget.index, limit = j, window = window, demand = math.max(before - leased, 0)}
      return false
    end
    if not l.top or window >= l.top then
      -- Past its last lease up to the home's full one, the pool holds nothing: no room at all.
      window = l.full + per
    else
      window = window + per
    end
  end
end

-- The earliest time >= slot at which one budget limit accepts the cost more: the first window from
-- the slot's that takes it (one past the horizon ends the search: the event is late whatever it
-- holds), jumping over the limit's run of full windows when the cost cannot fit beside what they
-- hold; what it walks updates the run exactly as schedule.rs's budget_accepts does.
local function budget_accepts(e, budget, l, slot, horizon, now)
  local per, n, run, cost, margin = l.per, l.n, l.run, e.cost, e.margin
  local window, t = outside_margin(slot, per, margin)
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
      local used, parts = window_use(budget, l, window)
      if window_takes(budget, n, used, parts, cost, window <= now) then
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
  -- A share that books nothing (a calendar limit of its period counts its windows) keeps no run.
  if walked_from and l.counts then
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
  return t
end

-- The least common fixpoint of every limit's "earliest time >= t it accepts the cost more" from
-- the frontier, after any pause (schedule.rs): each of the entity's limits moves the slot forward
-- at most once, so limits + 2 rounds settle it; a budget's calendar may move it again, never past
-- the horizon.
local function earliest_slot(e, values, last, horizon, now)
  local slot = now
  if last and last > now then
    slot = last
  end
  if e.paused_until and e.paused_until > slot then
    slot = e.paused_until
  end
  local limits, budgets = e.limits, e.budgets
  for b = 1, #budgets do
    local pause = budgets[b].pause
    if pause and pause > slot then
      slot = pause
    end
  end
  local rounds = #limits + 2
  if #budgets > 0 then
    rounds = 100000
  end
  for _ = 1, rounds do
    local next_slot = slot
    for i = 1, #limits do
      local t = limit_accepts(e, limits[i], tonumber(values[2 * i + 2]), tonumber(values[2 * i + 3]), last, slot)
      if t > next_slot then
        next_slot = t
      end
    end
    for b = 1, #budgets do
      local budget = budgets[b]
      for j = 1, #budget.limits do
        local t
        if budget.leased then
          t = pool_accepts(e, budget, budget.limits[j], j, slot, horizon, now)
          if not t then
            return false
          end
        else
          t = budget_accepts(e, budget, budget.limits[j], slot, horizon, now)
        end
        if t > next_slot then
          next_slot = t
        end
      end
    end
    if next_slot == slot then
      return slot
    end
    slot = next_slot
  end
  return nil
end

-- The runs of full windows the search changed, as HSET arguments of a budget's hash.
local function changed_runs(budget)
  local set = {}
  for j = 1, #budget.limits do
    local l = budget.limits[j]
    if l.run_changed then
      set[#set + 1], set[#set + 2] = 'run:' .. l.per, l.run.from .. ':' .. l.run.through .. ':' .. l.run.least
    end
    if l.booked_changed then
      set[#set + 1], set[#set + 2] = 'B:' .. l.per, l.booked
    end
  end
  return set
end

-- The entity's state after `slot` is reserved: each limit's two fields, the frontier, and its TTL.
local function commit_entity(e, values, slot, now)
  local state_key, cost, state_ttl = KEYS[e.base], e.cost, e.state_ttl
  local ttl = slot - now + state_ttl
  local changes = {'f', slot, 'ab', e.answers_base}
  local limits = e.limits
  for i = 1, #limits do
    local l = limits[i]
    local kind, per = l.kind, l.per
    local fa, fb = ARGV[e.state_from + 1 + 2 * i], ARGV[e.state_from + 2 + 2 * i]
    local a, b = tonumber(values[2 * i + 2]), tonumber(values[2 * i + 3])
    local n = #changes
    if kind == 'fixed' or kind == 'spread' or kind == 'share' then
      local window = slot - slot % per
      local used = cost
      if a == window then
        used = b + cost
      end
      changes[n + 1], changes[n + 2], changes[n + 3], changes[n + 4] = fa, window, fb, used
      values[2 * i + 2], values[2 * i + 3] = window, used
    elseif kind == 'gcra' then
      local tat, rem = a, b
      -- A slot this limit set is TAT rounded up to the millisecond; only a later slot restarts TAT.
      if not tat or slot > tat + (rem > 0 and 1 or 0) then
        tat, rem = slot, 0
      end
      rem = rem + cost * per
      tat = tat + math.floor(rem / l.count)
      rem = rem % l.count
      changes[n + 1], changes[n + 2], changes[n + 3], changes[n + 4] = fa, tat, fb, rem
      values[2 * i + 2], values[2 * i + 3] = tat, rem
    else
      local key = KEYS[e.base + 2 + l.extra]
      local base_cost = a or 0
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      local total = tonumber(newest[2]) or base_cost
      -- Members are slot times: a slot equal to the newest one merges into it (its total grows).
      redis.call('ZADD', key, total + cost, slot)
      while true do
        local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
        if not oldest[1] or tonumber(oldest[1]) > slot - per - e.margin then
          break
        end
        base_cost = tonumber(oldest[2])
        redis.call('ZREM', key, oldest[1])
      end
      changes[n + 1], changes[n + 2] = fa, base_cost
      values[2 * i + 2] = base_cost
      redis.call('PEXPIRE', key, ttl)
    end
  end
  -- The state must outlive the slot by its TTL margin; it is given twice that when it is set, so
  -- that most calls need no PEXPIRE.
  local expires = tonumber(values[2])
  local pexpire = false
  if e.folded or not expires or expires < slot + state_ttl then
    expires = slot + 2 * state_ttl
    changes[#changes + 1], changes[#changes + 2] = 'exp', expires
    -- Overrides may need the hash to live longer, or for ever.
    local keep = e.overrides ~= NO_OVERRIDES and overrides_keep(e.overrides)
    if keep == true then
      redis.call('PERSIST', state_key)
    else
      pexpire = math.max(expires, keep or 0) - now
    end
  end
  if e.folded then
    -- Carried over from an earlier version's layout (read_overrides).
    local blob = format_overrides(e.overrides)
    if blob ~= '' then
      changes[#changes + 1], changes[#changes + 2] = OVERRIDES, blob
    end
    values[#values - 1], e.folded = blob, false
    redis.call('HDEL', state_key, 'last')
    redis.call('DEL', KEYS[e.base + 2])
  end
  e.state.write(e, changes, pexpire)
  -- What this call's next event of the entity reads (a cached state): the state as it is now.
  values[1], values[2], values[3] = slot, expires, e.answers_base
end

-- Each budget: the slot's window of each limit takes the cost; windows before now's are dropped
-- (no slot is ever placed before now); the hash outlives its latest window by the state TTL.
local function commit_budgets(e, slot, now)
  local state_ttl, budgets = e.state_ttl, e.budgets
  for b = 1, #budgets do
    local budget = budgets[b]
    local key = budget.hash
    local set = changed_runs(budget)
    for j = 1, #budget.limits do
      local l = budget.limits[j]
      local per = l.per
      local name = per .. ':' .. (slot - slot % per)
      if l.counts then
        redis.call('HINCRBY', key, name, e.cost)
      end
      if l.counts and budget.own_floor and not l.share then
        redis.call('HINCRBY', key, name .. ':f:' .. budget.floors[budget.own_floor].rule, e.cost)
      end
      local current = now - now % per
      if budget.leased then
        -- A pool keeps the window before now's: what it booked of it sizes its next lease.
        current = current - per
      end
      -- A share that books nothing leaves its period's windows to the calendar limit that does.
      if l.counts and l.lo and l.lo < current then
        local floors, stranded = budget.floors, 0
        drop_windows(key, per, l.lo, current, function(name, dead)
          for k = 1, #floors do
            dead[#dead + 1] = name .. ':f:' .. floors[k].rule
          end
          if budget.leased then
            -- What the partition was leased of a passed window and did not book: stranded.
            local held = redis.call('HMGET', key, name, name .. ':l', name .. ':r')
            local holds = (tonumber(held[2]) or 0) - (tonumber(held[3]) or 0)
            stranded = stranded + math.max(holds - (tonumber(held[1]) or 0), 0)
            dead[#dead + 1] = name .. ':l'
            dead[#dead + 1] = name .. ':r'
          end
        end)
        if stranded > 0 then
          redis.call('HINCRBY', key, 'S:' .. per, stranded)
        end
      end
      if l.counts and (not l.lo or l.lo < current) then
        set[#set + 1], set[#set + 2] = 'lo:' .. per, current
      end
    end
    if not budget.exp or budget.exp < slot + state_ttl then
      set[#set + 1], set[#set + 2] = 'exp', slot + 2 * state_ttl
    end
    if #set > 0 then
      redis.call('HSET', key, unpack(set))
    end
    if not budget.exp and not budget.overridden then
      redis.call('PEXPIRE', key, slot + 2 * state_ttl - now)
    elseif not budget.exp or budget.exp < slot + state_ttl then
      -- GT: a pause or an adaptive level (budget.lua) may need it to live longer.
      redis.call('PEXPIRE', key, slot + 2 * state_ttl - now, 'GT')
    end
  end
end

-- Files the event's answer, before anything else is written: returns false (and writes nothing)
-- when the message already has one (a redelivery, which `decide` then answers with it). The
-- answers hash expires a minute + max_delay + a margin after its minute (or after now, for a
-- message first delivered later): once set in its minute, that covers every answer of the minute.
-- `expiry_set`: the state says it was set for this minute.
local function file_answer(e, kind, slot, now, expiry_set)
  local base = e.answers_base
  -- Relative, not PEXPIREAT: `now` may be a simulated time, far from the server's clock.
  local ttl = not (expiry_set and now <= base + ANSWER_MINUTE) and math.max(base - now, 0) + e.answers_keep
  local value = answer_value(kind, slot, now, now + e.lease - base, base, e.cost)
  if e.reslot then
    -- A new slot replaces the old answer.
    e.answers.set(e, value, ttl)
    return true
  end
  return e.answers.file(e, value, ttl)
end

-- The entity's overrides (an empty table, NO_OVERRIDES, for none: most entities) and its frontier,
-- carrying over an entity an earlier version wrote: its frontier was 'last' and its overrides a
-- hash of their own (commit_entity writes both the new way).
local function read_overrides(e, values)
  local n = e.state_to - e.state_from + 1
  local blob, legacy_last = values[n - 1], values[n]
  if not values[1] and legacy_last then
    e.overrides = parse_overrides(blob)
    e.folded = true
    fold_legacy_overrides(KEYS[e.base + 2], e.overrides)
    return tonumber(legacy_last)
  elseif blob then
    e.overrides = parse_overrides(blob)
  else
    e.overrides = NO_OVERRIDES
  end
  return tonumber(values[1])
end

-- What a correction did, as its reply's third number; its fifth is the cost it had booked.
local CORRECTION = {applied = 0, already = 1, unknown = 2}

-- A cost reported after the call (the event's cost) corrects what the message's reservation
-- booked, once (schedule.rs's correct): more is charged to its slot's windows, less given back.
local function correct(e, now)
  local recorded = e.answers.get(e)
  if not recorded then
    return reply(now, 'R', CORRECTION.unknown, now, 0)
  end
  local kind, slot, decided_at, _, booked = parse_answer(recorded)
  slot, decided_at = e.answers_base + slot, e.answers_base + decided_at
  if kind ~= 'R' then
    return reply(slot, kind, CORRECTION.unknown, now, booked)
  elseif redis.call('HSETNX', KEYS[e.base + 1], e.field .. CORRECTED, e.cost) == 0 then
    return reply(slot, kind, CORRECTION.already, now, booked)
  end
  -- The counts in force as an event of cost 1 sees them (no count is below it).
  local actual = e.cost
  e.cost = 1
  local values = e.state.read(e)
  local last = read_overrides(e, values)
  read_budgets(e, now)
  counts_in_force(e, now)
  if actual < booked then
    give_back(e, values, last, now, slot, booked - actual)
  elseif actual > booked then
    charge(e, values, now, slot, actual - booked)
  end
  return reply(slot, kind, CORRECTION.applied, now, booked)
end

-- A message file_answer found already answered: its answer, replayed.
local function known(e, now)
  return replay(e, e.answers.get(e), now)
end

-- The earliest slot for the event from its frontier (`last`, or the floor it carries over if
-- later), the search ending past its horizon (now + max_delay), and that horizon.
local function search(e, values, last, now)
  if e.floor and (not last or e.floor > last) then
    last = e.floor
  end
  local horizon = now + e.max_delay
  return earliest_slot(e, values, last, horizon, now), horizon
end

-- Nothing is reserved, but what the search walked is kept: the next search jumps over it.
local function keep_runs(e)
  for b = 1, #e.budgets do
    local set = changed_runs(e.budgets[b])
    if #set > 0 then
      redis.call('HSET', e.budgets[b].hash, unpack(set))
    end
  end
end

-- The queue of the entity's parked messages, oldest first: a list beside its state hash
-- ('<prefix>:state' -> '<prefix>:q'), each entry the message's answers hash, a newline and its
-- field (8 bytes); `<prefix>:h` lists those a drain took and is handing over.
local function queue_key(e)
  return string.sub(KEYS[e.base], 1, -6) .. 'q'
end
local function queue_entry(e)
  return KEYS[e.base + 1] .. '\n' .. e.field
end

-- Where the state's 'q' (how many messages are parked) sits among its fields; 'wk' follows it.
local function parked_at(e)
  return 4 + 2 * #e.limits
end

-- Sets 'q' and 'wk' (false: none) in the state and in `values` (a cached state's next event).
local function set_parked(e, values, parked, wake)
  local at = parked_at(e)
  values[at], values[at + 1] = parked, wake
  e.state.write(e, {'q', parked, 'wk', wake or ''}, false)
end

-- Whether an event whose earliest slot is `slot` parks (schedule.rs's parks): messages of the key
-- are parked already, or the key or one of its budgets is throttled (paused, or its level below
-- the ceiling) and the slot lies past the park horizon.
local function parks(e, values, slot, now)
  if (tonumber(values[parked_at(e)]) or 0) > 0 then
    return true
  end
  local throttled = (e.paused_until and e.paused_until > now) or (e.level and e.level < e.ceiling)
  for b = 1, #e.budgets do
    local budget = e.budgets[b]
    if (budget.pause and budget.pause > now) or (budget.level and budget.level < budget.ceiling) then
      throttled = true
    end
  end
  return throttled and slot > now + e.park
end

-- Appends the message to the key's queue. The queue and the state live while it may wait there
-- (its answer's life): a state's 'exp' says so, so that no commit shortens it.
local function park(e, values, now)
  local queue, at = queue_key(e), parked_at(e)
  redis.call('RPUSH', queue, queue_entry(e))
  redis.call('PEXPIRE', queue, e.answers_keep)
  set_parked(e, values, (tonumber(values[at]) or 0) + 1, tonumber(values[at + 1]) or false)
  local keep = now + e.answers_keep
  if not tonumber(values[2]) or tonumber(values[2]) < keep then
    values[2] = keep
    e.state.write(e, {'exp', keep}, false)
    redis.call('PEXPIRE', KEYS[e.base], e.answers_keep, 'GT')
  end
end

-- The drain of the key's parked messages at this one (schedule.rs's unpark): at the head of the
-- queue, the slot it gets now, reserved if no later than the deadline (`e.park`) and it leaves the
-- queue; else it stays and the drain wakes again ('wk'). Parked longer than its max_delay (from
-- when it was parked) or over a limit in force, it leaves with nothing reserved.
local function unpark(e, now)
  local queue, entry = queue_key(e), queue_entry(e)
  local recorded = e.answers.get(e)
  local kind, _, decided = parse_answer(recorded or '')
  local head = redis.call('LINDEX', queue, 0) == entry
  local since
  if kind == 'P' then
    since = e.answers_base + tonumber(decided)
  elseif not recorded and head then
    -- Its answer expired: the drain stopped for longer than max_delay and the margin.
    since = EXPIRED_PARK
  elseif redis.call('LPOS', queue, entry) then
    return {0, NOT_HEAD, 0, now, 0}
  else
    return {0, NOT_PARKED, 0, now, 0}
  end
  if not head then
    return {0, NOT_HEAD, 0, now, 0}
  end
  e.reslot = true
  e.max_delay = since + e.max_delay - now
  local deadline = e.park
  local values = e.state.read(e)
  local last = read_overrides(e, values)
  local at = parked_at(e)
  local parked, wake = tonumber(values[at]) or 0, tonumber(values[at + 1]) or false
  -- It leaves the queue for the list of messages being handed over (a task made for its slot, or
  -- a dead letter), until the drain says it is (RedisStore's handed_over): a drain that crashes
  -- between the two leaves it there for the next one.
  local leaves = function()
    local handing = string.sub(queue, 1, -2) .. 'h'
    redis.call('LPOP', queue)
    redis.call('RPUSH', handing, entry)
    redis.call('PEXPIRE', handing, e.answers_keep)
    if parked <= 1 then
      set_parked(e, values, 0, false)
    else
      set_parked(e, values, parked - 1, wake)
    end
  end
  if not read_budgets(e, now) or not counts_in_force(e, now) then
    leaves()
    file_answer(e, 'C', now, now, false)
    return reply(now, 'C', ATTEMPT.decided, now, now)
  end
  local slot, horizon = search(e, values, last, now)
  if not slot then
    return redis.error_reply('drip: slot search did not settle')
  end
  keep_runs(e)
  if slot > horizon then
    leaves()
    file_answer(e, 'L', slot, now, false)
    return reply(slot, 'L', ATTEMPT.decided, now, now)
  elseif slot > deadline then
    wake = math.min(math.max(slot - (deadline - now), now), now + MAX_WAKE_GAP)
    set_parked(e, values, parked, wake)
    return {slot, LATER, wake, now, 0}
  end
  leaves()
  file_answer(e, 'R', slot, now, false)
  commit_entity(e, values, slot, now)
  commit_budgets(e, slot, now)
  return reply(slot, 'R', ATTEMPT.decided, now, now)
end

-- One event: its recorded answer, or a new decision filed as its answer: its reply.
local function decide(e, now)
  if e.correct then
    return correct(e, now)
  elseif e.unpark then
    return unpark(e, now)
  end
  local recorded = not e.reslot and e.answers.ahead(e)
  if recorded then
    return replay(e, recorded, now)
  elseif e.reslot and e.park then
    -- A parked message has no slot to move: its key's drain gives it one.
    recorded = e.answers.get(e)
    if recorded and string.sub(recorded, 1, 1) == 'P' then
      return replay(e, recorded, now)
    end
  end
  -- 'exp' is when the state was last set to expire and 'ab' the answers minute whose expiry is
  -- set, so that most calls need neither PEXPIRE: every redis.call costs the script about as much
  -- as its own arithmetic.
  local values = e.state.read(e)
  local last = read_overrides(e, values)
  if not read_budgets(e, now) or not counts_in_force(e, now) then
    if not file_answer(e, 'C', now, now, false) then
      return known(e, now)
    end
    return reply(now, 'C', ATTEMPT.decided, now, now)
  end
  if e.reslot then
    local old, cost = old_slot(e)
    if old and e.gives_back then
      give_back(e, values, last, now, old, cost)
    end
  end
  local slot, horizon = search(e, values, last, now)
  if slot == false then
    -- A redelivery learns its answer when filing one fails (below): it must not ask for a lease.
    local recorded = not e.reslot and e.answers.get(e)
    if recorded then
      return replay(e, recorded, now)
    end
    return lease_wanted(e, now)
  elseif not slot then
    return redis.error_reply('drip: slot search did not settle')
  end
  if slot > horizon then
    if not file_answer(e, 'L', slot, now, false) then
      return known(e, now)
    end
    keep_runs(e)
    return reply(slot, 'L', ATTEMPT.decided, now, now)
  end
  if e.park and parks(e, values, slot, now) then
    if not file_answer(e, 'P', slot, now, false) then
      return known(e, now)
    end
    park(e, values, now)
    keep_runs(e)
    return reply(slot, 'P', ATTEMPT.decided, now, now)
  end
  if not file_answer(e, 'R', slot, now, tonumber(values[3]) == e.answers_base) then
    return known(e, now)
  end
  commit_entity(e, values, slot, now)
  commit_budgets(e, slot, now)
  return reply(slot, 'R', ATTEMPT.decided, now, now)
end

-- Leases the partitions' homes granted (lease.lua), credited to their pools: a lease is the
-- partition's total of the window, so a credit taken twice or out of order changes nothing.
local function credit(now)
  local key, per, window, total, full, keep = KEYS[int()], int(), int(), int(), int(), int()
  local full_field, top_field = 'F:' .. per, 'T:' .. per
  local set = {}
  local held = redis.call('HMGET', key, full_field, top_field)
  if not tonumber(held[1]) or full > tonumber(held[1]) then
    set[#set + 1], set[#set + 2] = full_field, full
  end
  if window then
    local name = per .. ':' .. window .. ':l'
    local leased = tonumber(redis.call('HGET', key, name)) or 0
    if total > leased then
      set[#set + 1], set[#set + 2] = name, total
      lower_booked(key, per, window)
    end
    if not tonumber(held[2]) or window > tonumber(held[2]) then
      set[#set + 1], set[#set + 2] = top_field, window
    end
  end
  if #set > 0 then
    redis.call('HSET', key, unpack(set))
    local ttl = math.max((window or now) + keep - now, 1)
    if redis.call('PTTL', key) < ttl then
      redis.call('PEXPIRE', key, ttl)
    end
  end
end

-- One call: the leases' credits, then each event in order. Everything a call keeps starts afresh
-- (this file runs as a function library, whose top level runs once; scripts.rs's wrapper resets
-- the argument cursor).
local function main()
  reads, answers, writes = {}, {}, {}
  local now = clock(int())
  for _ = 1, int() do
    credit(now)
  end
  local count = int()
  if count == 1 then
    -- An event alone shares nothing: no sharing tables, and its reply is the call's.
    local decided = decide(read_event(), now)
    flush_writes()
    return decided
  end
  local events = {}
  for i = 1, count do
    events[i] = read_event()
  end
  share(events)
  local replies = {}
  for i = 1, #events do
    local decided = decide(events[i], now)
    if decided.err then
      -- What the events before it decided stands (their answers are filed): so does their state.
      flush_writes()
      return decided
    end
    local n = #replies
    for j = 1, REPLY_LENGTH do
      replies[n + j] = decided[j]
    end
    if decided[2] == STATUS.W then
      -- The events after it wait for its lease: the caller sends them again with it.
      break
    end
  end
  flush_writes()
  return replies
end
