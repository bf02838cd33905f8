-- The lean path: an event of the shape most rules have (its key's own limits, no budget, no
-- class, no floor carried over: args.rs marks it mode 'lean') decided from its record's places
-- into locals, without the tables `read_event` builds. Its storage, arithmetic and answers are the
-- general path's (limit_accepts, commit_entity, file_answer), so both read and write the same
-- state and either may decide a key's next event; it hands the event over to `decide`, in the same
-- call and before it writes anything, when its key needs more: overrides, a pause or an adaptive
-- level ('o'), a parked backlog, budgets its state says it charged (the rule had some), an earlier
-- version's layout, a cost over a limit, or a slot past max_delay.

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

-- A lean event as `share` and the storage see it: where its record and keys are, its message and
-- cost, and the few numbers of its record every decision reads (those of `like`, the event it is
-- written as like, when there is one).
local function lean_event(record, base, field, cost, like)
  local n, state_from, answers_base, lease, state_ttl, margin
  if like then
    n, state_from = like.limits, like.state_from
    answers_base, lease, state_ttl, margin = like.answers_base, like.lease, like.state_ttl, like.margin
  else
    n = tonumber(ARGV[record + EVENT_RECORD + 1])
    state_from = record + EVENT_RECORD + 2 + n * LIMIT_RECORD
    answers_base, lease = tonumber(ARGV[record + EVENT_ANSWERS_BASE]), tonumber(ARGV[record + EVENT_LEASE])
    state_ttl, margin = tonumber(ARGV[record + EVENT_STATE_KEEP]), tonumber(ARGV[record + EVENT_MARGIN])
  end
  return setmetatable({lean = true, record = record, base = base, field = field, cost = cost,
    answers_base = answers_base, lease = lease, state_ttl = state_ttl, margin = margin, limits = n,
    specs = false, like = like, state_from = state_from, state_to = state_from + STATE_HEAD + 2 * n + STATE_TAIL - 1,
    overrides = NO_OVERRIDES, reslot = false, folded = false, state = PLAIN_STATE, answers = PLAIN_ANSWERS},
    LEAN_RECORD)
end

-- A lean event at the cursor (the cursor moves past it), or the general reading of it when its
-- record is not of the lean shape after all.
local function read_lean()
  local at = arg_at
  local e = lean_event(at, tonumber(ARGV[at + EVENT_FIRST_KEY]), ARGV[at + EVENT_ANSWER_FIELD],
    tonumber(ARGV[at + EVENT_COST]), false)
  if ARGV[e.state_to + 1] ~= '0' then
    return read_event()
  end
  arg_at = e.state_to + 1
  return e
end

-- A lean event written as `=`, where its keys start, its answer field and its cost (args.rs's
-- `add`: a key's burst, or another key of the same rule in the same minute): `last`, the call's
-- last lean event written in full, but for its keys, message and cost.
local function read_like(last)
  local at = arg_at
  arg_at = at + 4
  return lean_event(last.record, tonumber(ARGV[at + 2]), ARGV[at + 3], tonumber(ARGV[at + 4]), last)
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
  local slot, n = now, e.limits
  if last and last > now then
    slot = last
  end
  for _ = 1, n + 2 do
    local next_slot = limits_accept(e, values, last, slot, n, lean_limit)
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
  local frontier, parked, charges = values[STATE_FRONTIER], values[tail + STATE_PARKED], values[tail + STATE_CHARGES]
  if values[tail + STATE_OVERRIDES] or (parked and tonumber(parked) > 0) or (charges and charges ~= '')
    or (not frontier and values[tail + STATE_LEGACY_FRONTIER]) or not lean_limits(e) then
    return hand_over(e, values, now)
  end
  local slot = lean_slot(e, values, tonumber(frontier), now)
  if not slot or slot > now + e.max_delay then
    return hand_over(e, values, now)
  end
  if not file_answer(e, 'R', slot, now, values) then
    return known(e, now)
  end
  commit_entity(e, values, slot, now, e.limits, lean_limit)
  return reply(slot, 'R', ATTEMPT.decided, now, now)
end
