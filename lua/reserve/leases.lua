-- Leased budgets past one shard: a partition's pool books what the budget's home leased it,
-- gives back what leaves its windows, and takes the credits of a call.

-- Moves `delta` units into (positive) or out of (negative) the window of `slot` of each budget
-- limit where it has not closed (schedule.rs's shift_budget_windows): out only of start-placed
-- windows, never below zero, and a run of full windows it lies in keeps only what it now holds.
-- A window up to the pool's booked hint gained room (a credit, a give-back): the hint ends before it.
local function lower_booked(key, per, window)
  local booked = tonumber(HASH.get(key, 'B:' .. per))
  if booked and window <= booked then
    HASH.set(key, {'B:' .. per, window - per})
  end
end

-- A pool gives up to `units` of a window's lease back (schedule.rs's give_back_lease): what its
-- lease holds beyond what it booked, at most; 'R' lists the windows with returns, which the store
-- sends the home after the call (RedisStore::send_returns, lua/returns.lua).
local function give_back_lease(key, per, window, units, now)
  local name = per .. ':' .. window
  local held = HASH.get_all(key, {name, name .. ':l', name .. ':r', FIELD_POOL_RETURNS})
  local spare = (tonumber(held[2]) or 0) - (tonumber(held[3]) or 0) - (tonumber(held[1]) or 0)
  units = math.min(units, spare)
  if units <= 0 then
    return false
  end
  HASH.add(key, name .. ':r', units)
  HASH.set(key, {FIELD_POOL_RETURNS, returns_listed(held[4], {name}, now)})
  return true
end

-- A pool's window of a leased budget limit: what the partition booked of it and what it was
-- leased, less what it gave back of the lease (no longer its to book: `give_back_lease`).
local function read_pool_window(budget, l, window)
  local name = l.per .. ':' .. window
  local held = HASH.get_all(budget.hash, {name, name .. ':l', name .. ':r'})
  return tonumber(held[1]) or 0, (tonumber(held[2]) or 0) - (tonumber(held[3]) or 0)
end

local function pool_use(budget, l, window)
  return window_once(budget, l, window, read_pool_window)
end

-- Whether every window of limit `short` lies inside one window of limit `long` (schedule.rs's
-- nests_in): a shorter period that divides the longer one.
local function nests_in(short, long)
  return short.per < long.per and long.per % short.per == 0
end

-- A pool that has booked all it holds of a window of a longer limit, where its home was full when
-- it last asked, can book nothing in its shorter limits' windows inside it: it gives back what it
-- holds and has not booked of each that has not closed (schedule.rs's give_up_short_leases). It
-- looks from now's window of the longer limit up to `slot`'s and stops at the first it can still
-- book in; 'G:<per>' (l.given_up) keeps the last one given up. Returns whether it gave any back
-- (the store then sends the returns home).
local function give_up_short_leases(budget, slot, now)
  local key, limits, gave = budget.hash, budget.limits, false
  for j = 1, #limits do
    local long = limits[j]
    local per = long.per
    local current = now - now % per
    local window = long.given_up and math.max(long.given_up + per, current) or current
    local through = long.full and math.min(long.full, slot - slot % per)
    -- (Most bookings have no window to look at: the shorter limits are found only when they do.)
    local shorter
    if through and window <= through then
      shorter = {}
      for k = 1, #limits do
        if nests_in(limits[k], long) then
          shorter[#shorter + 1] = limits[k]
        end
      end
    end
    while shorter and #shorter > 0 and window <= through do
      local used, holds = read_pool_window(budget, long, window)
      if used < holds then
        break
      end
      for s = 1, #shorter do
        local l = shorter[s]
        -- (Past its latest lease the pool holds nothing.)
        local last = math.min(window + per - l.per, l.top or window - l.per)
        for w = math.max(window, now - now % l.per), last, l.per do
          if give_back_lease(key, l.per, w, math.huge, now) then
            l.used[w], gave = nil, true
          end
        end
      end
      long.given_up = window
      HASH.set(key, {'G:' .. per, window})
      window = window + per
    end
  end
  return gave
end

-- The first window of limit `l` the pool can still book (schedule.rs's pool_reach): past every
-- window of a longer limit of its budget it gave up (give_up_short_leases); 0 for any.
local function pool_reach(budget, l)
  local reach = 0
  for k = 1, #budget.limits do
    local long = budget.limits[k]
    if long.given_up and nests_in(l, long) then
      reach = math.max(reach, long.given_up + long.per)
    end
  end
  return reach
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
  -- (Not past the horizon: a drained message's horizon may lie before the hint, and its walk ends
  -- at the first window past it, as the model's does.)
  if l.booked and window <= l.booked and l.booked + per <= horizon then
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
      e.wanted = {budget = budget.index, limit = j, window = window, reach = pool_reach(budget, l)}
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

-- Leases the partitions' homes granted (lease.lua), credited to their pools: a lease is the
-- partition's total of the window, so a credit taken twice or out of order changes nothing.
local function credit(now)
  local key, per, window, total, full, keep = KEYS[int()], int(), int(), int(), int(), int()
  local full_field, top_field = 'F:' .. per, 'T:' .. per
  local set = {}
  local held = HASH.get_all(key, {full_field, top_field})
  if not tonumber(held[1]) or full > tonumber(held[1]) then
    set[#set + 1], set[#set + 2] = full_field, full
  end
  if window then
    local name = per .. ':' .. window .. ':l'
    local leased = tonumber(HASH.get(key, name)) or 0
    if total > leased then
      set[#set + 1], set[#set + 2] = name, total
      lower_booked(key, per, window)
    end
    if not tonumber(held[2]) or window > tonumber(held[2]) then
      set[#set + 1], set[#set + 2] = top_field, window
    end
  end
  if #set > 0 then
    HASH.set(key, set)
    local ttl = math.max((window or now) + keep - now, 1)
    if HASH.life(key) < ttl then
      HASH.keep(key, ttl)
    end
  end
end
