-- Budget calendars: shared budgets and classes calendars read once per call, their counts in
-- force (overrides and adaptive levels), when a window takes an event (floors and shares), their
-- full runs, and what a booking writes into them.

-- A classes calendar met for the first time takes over what its key booked before the rule had
-- classes (schedule.rs's carry_over): each limit's latest window from the key's own state, where it
-- has not closed, and the key's last slot, after which every class books. Returns that slot (0:
-- none), which the calendar keeps in 'c'.
local function carry_over(e, budget, now)
  -- The calendar's limits, then each period only a share counts: its fair share's state.
  local names, limits = {FIELD_FRONTIER}, {}
  for j = 1, #budget.limits do
    local l = budget.limits[j]
    if not l.share or l.counts then
      local id = (l.share and l.share.id) or ('fixed:' .. l.per)
      limits[#limits + 1] = l
      names[2 * #limits], names[2 * #limits + 1] = id .. ':w', id .. ':u'
    end
  end
  local key = KEYS[e.base + budget.carry_key]
  local before = HASH.get_all(key, names)
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
      HASH.add(budget.hash, per .. ':' .. window, used)
    end
  end
  HASH.set(budget.hash, {FIELD_CARRIED, carried})
  if not budget.exp and not budget.overridden then
    HASH.keep(budget.hash, math.max(carried, now) + 2 * e.state_ttl - now)
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
    local held = HASH.get_span(budget.hash, budget.fields_from, budget.fields_to)
    budget.pause, budget.exp = tonumber(held[BUDGET_PAUSE]) or false, tonumber(held[BUDGET_EXPIRES]) or false
    budget.level = budget.ceiling and level_in_force(held[BUDGET_ADAPT], budget.ceiling, budget.step, budget.window, now)
    -- A classes calendar's override of a limit (its id is 'fixed:<per>': the calendar's limits are
    -- fixed windows) replaces the limit's count until its end.
    local o = budget.per_key and parse_overrides(held[#held - BUDGET_TAIL + BUDGET_OVERRIDES])
    -- Overrides keep the hash alive (override.lua's expire_entity): an expiry set here only extends.
    budget.overridden = o and next(o) ~= nil
    if budget.per_key then
      local carried = tonumber(held[#held - BUDGET_TAIL + BUDGET_CARRIED]) or carry_over(e, budget, now)
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
        l.n = scaled(l.n, budget.level, e.cost)
      end
      -- A column's field of limit j: held[BUDGET_HEAD + (column - 1) * count + j].
      l.lo, l.used, l.beside = tonumber(held[BUDGET_HEAD + (BUDGET_OLDEST - 1) * count + j]) or false, {}, {}
      if budget.leased then
        l.full = tonumber(held[BUDGET_HEAD + (BUDGET_POOL_FULL - 1) * count + j]) or false
        l.top = tonumber(held[BUDGET_HEAD + (BUDGET_POOL_TOP - 1) * count + j]) or false
        l.booked, l.booked_changed = tonumber(held[BUDGET_HEAD + (BUDGET_POOL_BOOKED - 1) * count + j]) or false, false
        l.given_up = tonumber(held[BUDGET_HEAD + (BUDGET_POOL_GIVEN_UP - 1) * count + j]) or false
      end
      local run = l.counts and held[BUDGET_HEAD + (BUDGET_RUN - 1) * count + j]
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
        local n = scaled(from.limits[share.limit].n, from.share, e.cost)
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
        limit = scaled(limit, budget.level, e.cost)
      end
      limit = scaled(limit, budget.share, e.cost)
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
        limit = scaled(limit, level, e.cost)
      end
    end
    l.count = limit
  end
  return true
end

-- What a budget window holds: its cost, and each floor's part of it (false without floors).
local function read_calendar_window(budget, l, window)
  local name, floors = l.per .. ':' .. window, budget.floors
  if #floors == 0 or l.share then
    return tonumber(HASH.get(budget.hash, name)) or 0, false
  end
  local names = {name}
  for k = 1, #floors do
    names[k + 1] = name .. ':f:' .. floors[k].rule
  end
  local held, parts = HASH.get_all(budget.hash, names), {}
  for k = 1, #floors do
    parts[k] = tonumber(held[k + 1]) or 0
  end
  return tonumber(held[1]) or 0, parts
end

local function window_use(budget, l, window)
  return window_once(budget, l, window, read_calendar_window)
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
        HASH.add(key, name, e.cost)
      end
      if l.counts and budget.own_floor and not l.share then
        HASH.add(key, name .. ':f:' .. budget.floors[budget.own_floor].rule, e.cost)
      end
      local current = now - now % per
      -- A share that books nothing leaves its period's windows to the calendar limit that does.
      if l.counts and l.lo and l.lo < current then
        local floors, stranded = budget.floors, 0
        drop_windows(key, per, l.lo, current, function(name, dead)
          for k = 1, #floors do
            dead[#dead + 1] = name .. ':f:' .. floors[k].rule
          end
          if budget.leased then
            -- What the partition was leased of a passed window and did not book: stranded.
            local held = HASH.get_all(key, {name, name .. ':l', name .. ':r'})
            local holds = (tonumber(held[2]) or 0) - (tonumber(held[3]) or 0)
            stranded = stranded + math.max(holds - (tonumber(held[1]) or 0), 0)
            dead[#dead + 1] = name .. ':l'
            dead[#dead + 1] = name .. ':r'
          end
        end)
        if stranded > 0 then
          HASH.add(key, 'S:' .. per, stranded)
        end
      end
      if l.counts and (not l.lo or l.lo < current) then
        set[#set + 1], set[#set + 2] = 'lo:' .. per, current
      end
    end
    if not budget.exp or budget.exp < slot + state_ttl then
      set[#set + 1], set[#set + 2] = FIELD_EXPIRES, slot + 2 * state_ttl
    end
    HASH.set(key, set)
    if budget.leased and give_up_short_leases(budget, slot, now) then
      e.gave_back = true
    end
    if not budget.exp and not budget.overridden then
      HASH.keep(key, slot + 2 * state_ttl - now)
    elseif not budget.exp or budget.exp < slot + state_ttl then
      -- GT: a pause or an adaptive level (budget.lua) may need it to live longer.
      HASH.keep(key, slot + 2 * state_ttl - now, 'GT')
    end
  end
end

-- Nothing is reserved, but what the search walked is kept: the next search jumps over it.
local function keep_runs(e)
  for b = 1, #e.budgets do
    HASH.set(e.budgets[b].hash, changed_runs(e.budgets[b]))
  end
end

-- Moves `delta` units into (positive) or out of (negative) `slot`'s window of each budget limit
-- (schedule.rs's shift_budget_windows): a shared budget's only when the slot `charged` it
-- (charged_by), a classes calendar's always.
local function shift_budgets(e, slot, now, delta, charged)
  for j = 1, #e.budgets do
    local budget = e.budgets[j]
    if charged or budget.per_key then
      for k = 1, #budget.limits do
        local l = budget.limits[k]
        local per = l.per
        local window = slot - slot % per
        if l.counts and window + per > now and not (delta < 0 and l.spread) then
          local name = per .. ':' .. window
          local before = tonumber(HASH.get(budget.hash, name))
          if before then
            local used = math.max(before + delta, 0)
            HASH.set(budget.hash, {name, used})
            if budget.own_floor and not l.share then
              local part = name .. ':f:' .. budget.floors[budget.own_floor].rule
              local held = tonumber(HASH.get(budget.hash, part))
              if held then
                HASH.set(budget.hash, {part, math.max(held + delta, 0)})
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
              HASH.set(budget.hash, {'run:' .. per, run.from .. ':' .. run.through .. ':' .. used})
            end
          end
        end
      end
    end
  end
end
