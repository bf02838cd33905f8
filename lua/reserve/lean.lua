-- The lean path: an event of the shape most rules have (its key's own limits, no budget, no
-- class, no floor carried over: args.rs marks it mode 'lean') decided from its record's places
-- into locals, without the tables `read_event` builds. Its storage, arithmetic and answers are the
-- general path's (limit_accepts, commit_entity, file_answer), so both read and write the same
-- state and either may decide a key's next event; it hands the event over to `decide`, in the same
-- call and before it writes anything, when its key needs more: overrides, a pause or an adaptive
-- level ('o'), a parked backlog, an earlier version's layout, a cost over a limit, or a slot past
-- max_delay.

-- Limit i of a lean event: kind, period, count in force and extra, as `lean_limits` parsed them.
local function lean_limit(e, i)
  local specs, at = e.specs, 4 * i
  return specs[at - 3], specs[at - 2], specs[at - 1], specs[at]
end

-- Each limit of a lean event from its record, once, into `e.specs` (kind, period, count in force,
-- extra, for each in turn): the rule's count (a key with overrides or a level goes the general
-- way), at the adaptive ceiling when the rule has one. False when the cost is over one of them
-- (counts_in_force's refusal, which the general path answers).
local function lean_limits(e)
  local like = e.like
  if like and like.specs and like.cost == e.cost then
    e.specs = like.specs
    return true
  end
  local at, cost, specs = e.record + EVENT_RECORD + 1, e.cost, {}
  local ceiling = ARGV[e.record + ADAPTIVE_CEILING] ~= '' and tonumber(ARGV[e.record + ADAPTIVE_CEILING])
  for i = 1, e.limits do
    local kind, count, extra = ARGV[at + LIMIT_KIND], tonumber(ARGV[at + LIMIT_COUNT]), tonumber(ARGV[at + LIMIT_EXTRA])
    if kind == 'gcra' then
      if cost > extra then
        return false
      end
    elseif cost > count then
      return false
    elseif ceiling then
      count = scaled(count, ceiling, cost)
    end
    local j = 4 * i
    specs[j - 3], specs[j - 2], specs[j - 1], specs[j] = kind, tonumber(ARGV[at + LIMIT_PER]), count, extra
    at = at + LIMIT_RECORD
  end
  e.specs = specs
  return true
end

-- What the shared rooms read of a lean event only now and then (an expiry to set, the horizon),
-- parsed from its record when first asked.
local LEAN_LATER = {answers_keep = EVENT_ANSWERS_KEEP, max_delay = EVENT_MAX_DELAY}
local LEAN_RECORD = {__index = function(e, name)
  local at = LEAN_LATER[name]
  if at then
    local value = tonumber(ARGV[e.record + at])
    rawset(e, name, value)
    return value
  end
end}

-- A lean event at the cursor, as `share` and the storage see it (the cursor moves past it), or
-- the general reading of it when its record is not of the lean shape after all.
local function read_lean()
  local at = arg_at
  local n = tonumber(ARGV[at + EVENT_RECORD + 1])
  local state_from = at + EVENT_RECORD + 2 + n * LIMIT_RECORD
  local state_to = state_from + STATE_HEAD + 2 * n + STATE_TAIL - 1
  if ARGV[state_to + 1] ~= '0' then
    return read_event()
  end
  arg_at = state_to + 1
  return setmetatable({lean = true, record = at, base = tonumber(ARGV[at + EVENT_FIRST_KEY]),
    field = ARGV[at + EVENT_ANSWER_FIELD], cost = tonumber(ARGV[at + EVENT_COST]),
    answers_base = tonumber(ARGV[at + EVENT_ANSWERS_BASE]), lease = tonumber(ARGV[at + EVENT_LEASE]),
    state_ttl = tonumber(ARGV[at + EVENT_STATE_KEEP]), margin = tonumber(ARGV[at + EVENT_MARGIN]), limits = n,
    specs = false, like = false, state_from = state_from, state_to = state_to, overrides = NO_OVERRIDES,
    reslot = false, folded = false, state = PLAIN_STATE, answers = PLAIN_ANSWERS}, LEAN_RECORD)
end

-- A lean event written as `=`, where its keys start, its answer field and its cost (args.rs's
-- `add`: a key's burst, or another key of the same rule in the same minute): `last`, the call's
-- last lean event written in full, but for its keys, message and cost.
local function read_like(last)
  local base, field, cost = tonumber(ARGV[arg_at + 2]), ARGV[arg_at + 3], tonumber(ARGV[arg_at + 4])
  arg_at = arg_at + 4
  return setmetatable({lean = true, record = last.record, base = base, field = field, cost = cost,
    answers_base = last.answers_base, lease = last.lease, state_ttl = last.state_ttl, margin = last.margin,
    limits = last.limits, specs = false, like = last, state_from = last.state_from, state_to = last.state_to,
    overrides = NO_OVERRIDES, reslot = false, folded = false, state = PLAIN_STATE, answers = PLAIN_ANSWERS},
    LEAN_RECORD)
end

-- The general path's decision of a lean event: its record read whole, its storage and the state
-- it read (`values`) kept.
local function hand_over(e, values, now)
  local cursor = arg_at
  arg_at = e.record
  local full = read_event()
  arg_at = cursor
  -- (An event written as like another has its own keys, message and cost: `read_like`.)
  full.base, full.field, full.cost = e.base, e.field, e.cost
  full.state, full.answers, full.values = e.state, e.answers, values
  return decide(full, now)
end

-- The earliest slot every limit accepts from the frontier (earliest_slot without pauses and
-- budgets: each limit moves the slot forward at most once), false if it does not settle.
local function lean_slot(e, values, last, now)
  local slot, n, specs = now, e.limits, e.specs
  if last and last > now then
    slot = last
  end
  for _ = 1, n + 2 do
    local next_slot = slot
    for i = 1, n do
      local j = 4 * i
      local t = limit_accepts(e, specs[j - 3], specs[j - 2], specs[j - 1], specs[j],
        tonumber(values[STATE_HEAD + 2 * i - 1]), tonumber(values[STATE_HEAD + 2 * i]), last, slot)
      if t > next_slot then
        next_slot = t
      end
    end
    if next_slot == slot then
      return slot
    end
    slot = next_slot
  end
  return false
end

-- One lean event: its recorded answer, or a new reservation filed as its answer, or the general
-- path's decision.
local function decide_lean(e, now)
  local recorded = e.answers.ahead(e)
  if recorded then
    return replay(e, recorded, now)
  end
  local values = e.state.read(e)
  local tail = STATE_HEAD + 2 * e.limits
  local frontier, parked = values[STATE_FRONTIER], values[tail + STATE_PARKED]
  if values[tail + STATE_OVERRIDES] or (parked and tonumber(parked) > 0)
    or (not frontier and values[tail + STATE_LEGACY_FRONTIER]) or not lean_limits(e) then
    return hand_over(e, values, now)
  end
  local slot = lean_slot(e, values, tonumber(frontier), now)
  if not slot or slot > now + e.max_delay then
    return hand_over(e, values, now)
  end
  -- The answers hash's expiry is set for this minute when the state says so (as read, a text;
  -- as an earlier event of the call left it, a number).
  local expiry_set = values[STATE_ANSWERS_EXPIRY]
  expiry_set = expiry_set == ARGV[e.record + EVENT_ANSWERS_BASE] or expiry_set == e.answers_base
  if not file_answer(e, 'R', slot, now, expiry_set) then
    return known(e, now)
  end
  commit_entity(e, values, slot, now, e.limits, lean_limit)
  return reply(slot, 'R', ATTEMPT.decided, now, now)
end
