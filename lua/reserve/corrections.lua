-- An event's old slot given back and a cost corrected after the call: units back to the
-- windows that hold them (and to a pool's home), or charged.

-- The slot of the message's answer, the cost it holds (the booked one, or the one reported after
-- the call) and when it was decided, if it holds one: a message given a new slot, whose new answer
-- starts afresh (the reported cost is dropped).
local function old_slot(e)
  local recorded, corrected = e.answers.get(e, e.field .. CORRECTED)
  local kind, slot, decided, _, cost = parse_answer(recorded or '')
  if corrected then
    HASH.remove(KEYS[e.base + KEY_ANSWERS], e.field .. CORRECTED)
  end
  if kind ~= 'R' then
    return nil
  end
  return e.answers_base + tonumber(slot), tonumber(corrected) or cost, e.answers_base + tonumber(decided)
end

-- Whether a slot decided at `decided` charged the event's shared budgets (schedule.rs's
-- charged_by): the entity's reservations have charged the same ones since then. A slot reserved
-- before its rule had a budget took nothing from it, so gives it nothing back.
local function charged_since(e, values, decided)
  local since, names = parse_charges(values[STATE_HEAD + 2 * #e.limits + STATE_CHARGES])
  return since ~= nil and names == e.charges and decided >= since
end

-- Gives `cost` units of the slot `old` back (schedule.rs's give_back), wherever the window
-- that holds them has not closed and can take them back exactly: the entity's fixed (start)
-- windows and fair shares when the slot lies in the window it holds, budgets' start-placed
-- windows; gcra and sliding only when it is the entity's latest slot (`last`). Written at once:
-- they stand whatever the new decision.
local function give_back(e, values, last, now, old, cost, charged)
  local latest, limits, changes = last == old, e.limits, {}
  for i = 1, #limits do
    local l = limits[i]
    local kind, per = l.kind, l.per
    local a, b = tonumber(values[STATE_HEAD + 2 * i - 1]), tonumber(values[STATE_HEAD + 2 * i])
    local fa, fb = ARGV[e.state_from + 1 + 2 * i], ARGV[e.state_from + 2 + 2 * i]
    if (kind == 'fixed' or kind == 'share') and a == old - old % per and a + per > now then
      local used = math.max(b - cost, 0)
      values[STATE_HEAD + 2 * i] = used
      changes[#changes + 1], changes[#changes + 2] = fb, used
    elseif kind == 'gcra' and latest and a then
      -- TAT - cost * T, exactly: its remainder is in units of 1/count ms.
      local d = b - cost * per
      local tat, rem = a + math.floor(d / l.count), d % l.count
      values[STATE_HEAD + 2 * i - 1], values[STATE_HEAD + 2 * i] = tat, rem
      changes[#changes + 1], changes[#changes + 2], changes[#changes + 3], changes[#changes + 4] = fa, tat, fb, rem
    elseif kind == 'sliding' and latest and a then
      local key = KEYS[e.base + KEY_SLIDING - 1 + l.extra]
      local newest = SLOTS.newest(key, 2)
      local n = #newest
      if n >= 2 and tonumber(newest[n - 1]) == old then
        local before = (n == 4 and tonumber(newest[2])) or a
        local total = tonumber(newest[n]) - cost
        if total <= before then
          SLOTS.remove(key, newest[n - 1])
        else
          SLOTS.put(key, newest[n - 1], total)
        end
      end
    end
  end
  e.state.write(e, changes, false)
  shift_budgets(e, old, now, -cost, charged)
end

-- Charges `more` units to `slot`'s windows (schedule.rs's charge): the entity's fixed windows and
-- fair shares when the slot lies in the window it holds, budgets' windows that have not closed, a
-- gcra limit's TAT, a sliding limit's newest slot.
local function charge(e, values, now, slot, more, charged)
  local limits, changes = e.limits, {}
  for i = 1, #limits do
    local l = limits[i]
    local kind, per = l.kind, l.per
    local a, b = tonumber(values[STATE_HEAD + 2 * i - 1]), tonumber(values[STATE_HEAD + 2 * i])
    local fa, fb = ARGV[e.state_from + 1 + 2 * i], ARGV[e.state_from + 2 + 2 * i]
    if (kind == 'fixed' or kind == 'spread' or kind == 'share') and a == slot - slot % per then
      values[STATE_HEAD + 2 * i] = b + more
      changes[#changes + 1], changes[#changes + 2] = fb, b + more
    elseif kind == 'gcra' and a then
      local rem = b + more * per
      local tat = a + math.floor(rem / l.count)
      rem = rem % l.count
      values[STATE_HEAD + 2 * i - 1], values[STATE_HEAD + 2 * i] = tat, rem
      changes[#changes + 1], changes[#changes + 2], changes[#changes + 3], changes[#changes + 4] = fa, tat, fb, rem
    elseif kind == 'sliding' and a then
      local key = KEYS[e.base + KEY_SLIDING - 1 + l.extra]
      local newest = SLOTS.newest(key, 1)
      if newest[1] then
        SLOTS.put(key, newest[1], tonumber(newest[2]) + more)
      end
    end
  end
  e.state.write(e, changes, false)
  shift_budgets(e, slot, now, more, charged)
end

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
  elseif not HASH.set_new(KEYS[e.base + KEY_ANSWERS], e.field .. CORRECTED, e.cost) then
    return reply(slot, kind, CORRECTION.already, now, booked)
  end
  -- The counts in force as an event of cost 1 sees them (no count is below it).
  local actual = e.cost
  e.cost = 1
  local values = e.state.read(e)
  local last = read_overrides(e, values)
  read_budgets(e, now)
  counts_in_force(e, now)
  local charged = charged_since(e, values, decided_at)
  if actual < booked then
    give_back(e, values, last, now, slot, booked - actual, charged)
  elseif actual > booked then
    charge(e, values, now, slot, actual - booked, charged)
  end
  return reply(slot, kind, CORRECTION.applied, now, booked)
end
