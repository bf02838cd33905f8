-- What a reservation is asked and what it answers: an event's fields as args.rs writes them
-- (`read_event`), which storage each event uses (`share`), the reply's kinds and numbers, and an
-- answer as it is filed.

-- Chooses each event's storage: CACHED for an entity or answers hash another event of the call
-- shares. Reads the shared answers hashes' fields with one HMGET each.
local function share(events)
  local states, wanted, order = {}, {}, {}
  for i = 1, #events do
    local e = events[i]
    local state, key = KEYS[e.base + KEY_STATE], KEYS[e.base + KEY_ANSWERS]
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
    if states[KEYS[e.base + KEY_STATE]] > 1 then
      e.state = CACHED_STATE
    end
    if #wanted[KEYS[e.base + KEY_ANSWERS]] > 1 then
      e.answers = CACHED_ANSWERS
    end
  end
  for i = 1, #order do
    local key = order[i]
    local fields = wanted[key]
    if #fields > 1 then
      local values = HASH.get_all(key, fields)
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
  -- `record`: where the record starts, so that a room reads a field of its own concern itself
  -- (ARGV[e.record + EVENT_...]) and a new one touches no other room.
  local e = {record = at, base = tonumber(ARGV[at + EVENT_FIRST_KEY]), field = ARGV[at + EVENT_ANSWER_FIELD],
    cost = tonumber(ARGV[at + EVENT_COST]), max_delay = tonumber(ARGV[at + EVENT_MAX_DELAY]),
    answers_base = tonumber(ARGV[at + EVENT_ANSWERS_BASE]), answers_keep = tonumber(ARGV[at + EVENT_ANSWERS_KEEP]),
    lease = tonumber(ARGV[at + EVENT_LEASE]), state_ttl = tonumber(ARGV[at + EVENT_STATE_KEEP]),
    reslot = mode == 'keep' or mode == 'give', gives_back = mode == 'give', correct = mode == 'correct',
    unpark = mode == 'unpark', park = tonumber(ARGV[at + EVENT_PARK]) or false, level = false,
    floor = tonumber(ARGV[at + EVENT_FLOOR]) or false,
    margin = tonumber(ARGV[at + EVENT_MARGIN]), ceiling = tonumber(ARGV[at + ADAPTIVE_CEILING]) or false,
    step = tonumber(ARGV[at + ADAPTIVE_STEP]), window = tonumber(ARGV[at + ADAPTIVE_WINDOW]),
    body = ARGV[at + EVENT_BODY], limits = {}, budgets = {}, paused_until = false, state_from = 0, state_to = 0,
    overrides = false,
    folded = false, state = PLAIN_STATE, answers = PLAIN_ANSWERS, values = false}
  local limits = e.limits
  for i = 1, int() do
    at = span(LIMIT_RECORD) - 1
    limits[i] = {kind = ARGV[at + LIMIT_KIND], per = tonumber(ARGV[at + LIMIT_PER]),
      n = tonumber(ARGV[at + LIMIT_COUNT]), extra = tonumber(ARGV[at + LIMIT_EXTRA]),
      id = ARGV[at + LIMIT_OVERRIDE_ID], count = 0}
  end
  -- The state's fields (args.rs's STATE_HEAD, each limit's two, STATE_TAIL), read at their places.
  e.state_from, e.state_to = span(STATE_HEAD + 2 * #limits + STATE_TAIL)
  local budgets = e.budgets
  for b = 1, int() do
    local budget = {key = int(), ceiling = int() or false, step = int(), window = int(), share = int(),
      leased = int() == 1, per_key = int() == 1, near = int(), ring_key = false, ring_member = false, carry_key = false, index = b, limits = {}, floors = {},
      own_floor = false, pause = false, exp = false, level = false, hash = false, overridden = false}
    if budget.near > 0 then
      -- A fair budget's ring of waiting keys, and this key's entry in it: a key that parks joins.
      budget.ring_key, budget.ring_member = int(), str()
    end
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
    -- then each limit's 'F:<per>', 'T:<per>', 'B:<per>' and 'G:<per>' (every column, the last
    -- one's number); a classes calendar then its key's overrides ('o') and the last slot of the
    -- backlog it carried over ('c').
    local per_limit = BUDGET_RUN
    if budget.leased then
      per_limit = BUDGET_POOL_GIVEN_UP
    end
    local calendar = 0
    if budget.per_key then
      calendar = 2
    end
    budget.fields_from, budget.fields_to = span(3 + per_limit * #budget_limits + calendar)
    budgets[b] = budget
  end
  -- The shared budgets it charges, by name (the state remembers them: commit_entity).
  e.charges = #budgets > 0 and str() or ''
  return e
end

-- An event's tables as `read_event` built them from `last`'s record, without parsing it again:
-- `last` is as read (a call reads all its events before it decides any), and nothing of its
-- tables is shared but what no decision writes (a budget's floors, a share's source).
local function copy_read(last)
  local e = {record = last.record, base = last.base, field = last.field, cost = last.cost,
    max_delay = last.max_delay, answers_base = last.answers_base, answers_keep = last.answers_keep,
    lease = last.lease, state_ttl = last.state_ttl, reslot = last.reslot, gives_back = last.gives_back,
    correct = last.correct, unpark = last.unpark, park = last.park, level = false, floor = last.floor,
    margin = last.margin, ceiling = last.ceiling, step = last.step, window = last.window,
    body = '', limits = {}, budgets = {}, paused_until = false, state_from = last.state_from, state_to = last.state_to,
    overrides = false, folded = false, state = PLAIN_STATE, answers = PLAIN_ANSWERS, values = false,
    charges = last.charges}
  local limits = e.limits
  for i = 1, #last.limits do
    local l = last.limits[i]
    limits[i] = {kind = l.kind, per = l.per, n = l.n, extra = l.extra, id = l.id, count = 0}
  end
  local budgets = e.budgets
  for b = 1, #last.budgets do
    local from = last.budgets[b]
    local budget = {key = from.key, ceiling = from.ceiling, step = from.step, window = from.window,
      share = from.share, leased = from.leased, per_key = from.per_key, near = from.near,
      ring_key = from.ring_key, ring_member = from.ring_member, carry_key = from.carry_key, index = b,
      limits = {}, floors = from.floors, own_floor = from.own_floor, pause = false, exp = false,
      level = false, hash = false, overridden = false, fields_from = from.fields_from,
      fields_to = from.fields_to}
    local budget_limits = budget.limits
    for j = 1, #from.limits do
      local l = from.limits[j]
      budget_limits[j] = {per = l.per, n = l.n, spread = l.spread, lo = false, run = false,
        run_changed = false, used = false, parts = false, leased = false, full = false, top = false,
        share = l.share, counts = l.counts}
    end
    budgets[b] = budget
  end
  return e
end

-- A general event written as `~`, where its keys start, its answer field, cost and answers
-- minute, the body it keeps should it park, then its key in each of its fair budgets' rings
-- (args.rs's `add`: a drain's heads, a group commit's events of one rule): `last`, the call's last
-- general event written in full, but for those.
local function read_alike(last)
  local at = arg_at
  local e = copy_read(last)
  e.base, e.field, e.cost, e.answers_base, e.body = tonumber(ARGV[at + 2]), ARGV[at + 3], tonumber(ARGV[at + 4]),
    tonumber(ARGV[at + 5]), ARGV[at + 6]
  at = at + 6
  local budgets = e.budgets
  for b = 1, #budgets do
    if budgets[b].ring_member then
      at = at + 1
      budgets[b].ring_member = ARGV[at]
    end
  end
  arg_at = at
  return e
end

-- An answer's kind as its reply's status (redis_store.rs's parse_reply): reserved, beyond
-- max_delay, cost over a limit in force (nothing reserved for the last two).
-- P: parked (nothing reserved; the message waits in its key's queue). An unpark's reply may
-- also be LATER (its slot is past the drain's deadline), NOT_PARKED or NOT_HEAD.
-- The numbers are reply.rs's, written before the script (scripts.rs's shared numbers).
local STATUS = {R = REPLY_RESERVED, L = REPLY_MAX_DELAY, C = REPLY_COST_OVER, W = REPLY_LEASE_WANTED, P = REPLY_PARKED}

local LATER, NOT_PARKED, NOT_HEAD = REPLY_LATER, REPLY_NOT_PARKED, REPLY_NOT_HEAD

-- What the attempt that asked may do: act on a new decision, act on the message's earlier answer
-- (its lease taken again), not act (another attempt holds the lease), or nothing (acted upon).
local ATTEMPT = {decided = ATTEMPT_DECIDED, resumed = ATTEMPT_RESUMED, busy = ATTEMPT_BUSY, done = ATTEMPT_DONE}

-- A decision's attempt: decided, flagged when its booking gave units of a pool back (reply.rs's
-- gave_back: the store sends them to the pool's home).
local function decided_attempt(e)
  return ATTEMPT.decided + (e.gave_back and REPLY_GAVE_BACK or 0)
end

-- One event's reply: the only place one is built.
local function reply(slot, kind, attempt, now, decided_at)
  return {slot, STATUS[kind], attempt, now, decided_at}
end

-- An event that needs a lease first (its call stops at it, nothing of it written but a new slot's
-- give-back): the window, W, which budget and limit of the event (budget * 256 + limit), the
-- horizon of its search (now and its max_delay: a drained message's, what is left of it) and the
-- first window its pool can still book (pool_reach).
local function lease_wanted(e, now)
  local wanted = e.wanted
  return {wanted.window, STATUS.W, wanted.budget * 256 + wanted.limit, now + e.max_delay, wanted.reach}
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

-- Files the event's answer, before anything else is written: returns false (and writes nothing)
-- when the message already has one (a redelivery, which `decide` then answers with it). The
-- answers hash expires a minute + max_delay + a margin after its minute (or after now, for a
-- message first delivered later): once set in its minute, that covers every answer of the minute.
-- `values`: the key's state as read, whose answers minute ('ab') says the expiry was set for this
-- minute; false where the expiry is set regardless.
local function file_answer(e, kind, slot, now, values)
  local base = e.answers_base
  local expiry_set = values and tonumber(values[STATE_ANSWERS_EXPIRY]) == base
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

-- What a correction did, as its reply's third number; its fifth is the cost it had booked.
local CORRECTION = {applied = CORRECTION_APPLIED, already = CORRECTION_ALREADY, unknown = CORRECTION_UNKNOWN}
