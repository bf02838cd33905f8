-- An entity's own limits: when each accepts an event (fixed, sliding, gcra), and what a
-- booking writes into the entity's state.

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
-- earliest_accepted): the limit's kind, period, count in force and extra (a gcra's burst, a
-- sliding limit's set among the event's), `a`, `b` its two state fields, `last` the entity's
-- frontier. Scalars, not the limit's table: the lean path has none.
local function limit_accepts(e, kind, per, limit, extra, a, b, last, t)
  local cost, margin = e.cost, e.margin
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
      local key = KEYS[e.base + KEY_SLIDING - 1 + extra]
      local newest = SLOTS.newest(key, 1)
      -- Drop the oldest slots until what is left leaves room for `cost`.
      local threshold = (tonumber(newest[2]) or a) - (limit - cost)
      if threshold > a then
        return math.max(t, tonumber(SLOTS.first_from(key, threshold)) + per + margin)
      end
    elseif last then
      return math.max(t, last + per + margin)
    end
    return t
  elseif a then
    -- An event of cost c waits until c units conform: TAT - (burst - c) * T (schedule.rs).
    local x = b - (extra - cost) * per
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

-- A limit's two state fields after `slot` is booked at the cost: a fixed window's and what it
-- holds, a gcra limit's TAT and remainder, a sliding limit's base cost (its set gets the slot;
-- `ttl` its life) and nothing.
local function limit_booked(e, kind, per, limit, extra, a, b, slot, ttl)
  local cost = e.cost
  if kind == 'fixed' or kind == 'spread' or kind == 'share' then
    local window = slot - slot % per
    if a == window then
      return window, b + cost
    end
    return window, cost
  elseif kind == 'gcra' then
    local tat, rem = a, b
    -- A slot this limit set is TAT rounded up to the millisecond; only a later slot restarts TAT.
    if not tat or slot > tat + (rem > 0 and 1 or 0) then
      tat, rem = slot, 0
    end
    rem = rem + cost * per
    return tat + math.floor(rem / limit), rem % limit
  end
  local key = KEYS[e.base + KEY_SLIDING - 1 + extra]
  local base_cost = a or 0
  local newest = SLOTS.newest(key, 1)
  local total = tonumber(newest[2]) or base_cost
  -- Members are slot times: a slot equal to the newest one merges into it (its total grows).
  SLOTS.put(key, slot, total + cost)
  while true do
    local oldest = SLOTS.oldest(key)
    if not oldest[1] or tonumber(oldest[1]) > slot - per - e.margin then
      break
    end
    base_cost = tonumber(oldest[2])
    SLOTS.remove(key, oldest[1])
  end
  HASH.keep(key, ttl)
  return base_cost, nil
end

-- Limit i of the event as its table holds it (read_event's): kind, period, count in force, extra.
local function limit_of(e, i)
  local l = e.limits[i]
  return l.kind, l.per, l.count, l.extra
end

-- The latest of the times at or after `slot` at which each of the entity's `n` limits (each as
-- `limit(e, i)` gives it: limit_of, or the lean path's from its record) accepts the event.
local function limits_accept(e, values, last, slot, n, limit)
  local next_slot = slot
  for i = 1, n do
    local kind, per, count, extra = limit(e, i)
    local t = limit_accepts(e, kind, per, count, extra, tonumber(values[STATE_HEAD + 2 * i - 1]),
      tonumber(values[STATE_HEAD + 2 * i]), last, slot)
    if t > next_slot then
      next_slot = t
    end
  end
  return next_slot
end

-- The state's 'ch' (schedule.rs's EntityState::charges): since when the entity's reservations
-- have charged which shared budgets (their names, joined), or nothing.
local function parse_charges(held)
  local since, names = string.match(held or '', '^(%-?%d+):(.*)$')
  return tonumber(since), names
end

-- The entity's state after `slot` is reserved: each limit's two fields, the frontier, and its TTL.
-- `n` limits, each as `limit(e, i)` gives it (limit_of, or the lean path's from its record);
-- `also`: further changes of the state to write with these (an unpark's counts of the parked).
local function commit_entity(e, values, slot, now, n, limit, also)
  local state_key, state_ttl = KEYS[e.base + KEY_STATE], e.state_ttl
  local ttl = slot - now + state_ttl
  local changes
  if also then
    changes = also
    local c = #changes
    changes[c + 1], changes[c + 2], changes[c + 3], changes[c + 4] = FIELD_FRONTIER, slot, FIELD_ANSWERS_EXPIRY,
      e.answers_base
  else
    -- (Built whole: a table grown a field at a time costs a rehash each time its size doubles.)
    changes = {FIELD_FRONTIER, slot, FIELD_ANSWERS_EXPIRY, e.answers_base}
  end
  for i = 1, n do
    local kind, per, count, extra = limit(e, i)
    local at = STATE_HEAD + 2 * i
    local a, b = limit_booked(e, kind, per, count, extra, tonumber(values[at - 1]), tonumber(values[at]), slot, ttl)
    local c = #changes
    changes[c + 1], changes[c + 2] = ARGV[e.state_from + at - 2], a
    values[at - 1] = a
    if b then
      changes[c + 3], changes[c + 4] = ARGV[e.state_from + at - 1], b
      values[at] = b
    end
  end
  -- The state must outlive the slot by its TTL margin; it is given twice that when it is set, so
  -- that most calls need no PEXPIRE.
  local expires = tonumber(values[STATE_EXPIRES])
  local pexpire = false
  if e.folded or not expires or expires < slot + state_ttl then
    expires = slot + 2 * state_ttl
    changes[#changes + 1], changes[#changes + 2] = FIELD_EXPIRES, expires
    -- Overrides may need the hash to live longer, or for ever.
    local keep = e.overrides ~= NO_OVERRIDES and overrides_keep(e.overrides)
    if keep == true then
      HASH.keep_for_ever(state_key)
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
    values[STATE_HEAD + 2 * n + STATE_OVERRIDES], e.folded = blob, false
    HASH.remove(state_key, FIELD_LEGACY_FRONTIER)
    HASH.delete(KEYS[e.base + KEY_LEGACY_OVERRIDES])
  end
  -- Since when its reservations have charged which shared budgets (a lean event has none, and
  -- goes the general way while the state names some).
  local charges = e.charges
  if charges then
    local at = STATE_HEAD + 2 * n + STATE_CHARGES
    local held = values[at] or ''
    local _, names = parse_charges(held)
    if charges == '' and held ~= '' then
      values[at], changes[#changes + 1], changes[#changes + 2] = '', FIELD_CHARGES, ''
    elseif charges ~= '' and names ~= charges then
      local since = now .. ':' .. charges
      values[at], changes[#changes + 1], changes[#changes + 2] = since, FIELD_CHARGES, since
    end
  end
  e.state.write(e, changes, pexpire)
  -- What this call's next event of the entity reads (a cached state): the state as it is now.
  values[STATE_FRONTIER], values[STATE_EXPIRES], values[STATE_ANSWERS_EXPIRY] = slot, expires, e.answers_base
end
