-- The slot search: the earliest slot every limit of the event accepts (the model's fixpoint),
-- bounded by the horizon.

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
    local next_slot = limits_accept(e, values, last, slot, #limits, limit_of)
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

-- The earliest slot for the event from its frontier (`last`, or the floor it carries over if
-- later), the search ending past its horizon (now + max_delay), and that horizon.
local function search(e, values, last, now)
  if e.floor and (not last or e.floor > last) then
    last = e.floor
  end
  local horizon = now + e.max_delay
  return earliest_slot(e, values, last, horizon, now), horizon
end
