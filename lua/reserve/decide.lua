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
-- next reservation); 'ch' ('<since>:<names>'), which shared budgets its reservations charge and
-- since when (a slot decided before gives them nothing back: charged_since). A message's answer
-- is written with HSETNX before anything else is, so that the common path reads nothing more: a
-- message the hash already knows gets its first answer back.
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
--
-- scripts.rs assembles the rooms in order (storage, request, overrides, entity, leases,
-- calendars, corrections, search, parking, decide, lean, call): a local function is seen only by
-- the rooms after its own.

-- A message file_answer found already answered: its answer, replayed.
local function known(e, now)
  return replay(e, e.answers.get(e), now)
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
  -- (A lean event handed over brings the state it read.)
  local values = e.values or e.state.read(e)
  if e.park and not e.reslot and (tonumber(values[parked_at(e)]) or 0) > 0 then
    -- Behind messages of its key already parked (FIFO): it parks without a slot of its own.
    if not file_answer(e, 'P', now, now, values) then
      return known(e, now)
    end
    return reply(now, 'P', park(e, values, now, now), now, now)
  end
  local last = read_overrides(e, values)
  if not read_budgets(e, now) or not counts_in_force(e, now) then
    if not file_answer(e, 'C', now, now, false) then
      return known(e, now)
    end
    return reply(now, 'C', ATTEMPT.decided, now, now)
  end
  if e.reslot then
    local old, cost, decided = old_slot(e)
    if old and e.gives_back then
      give_back(e, values, last, now, old, cost, charged_since(e, values, decided))
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
    if not file_answer(e, 'P', slot, now, values) then
      return known(e, now)
    end
    local attempt = park(e, values, slot, now)
    keep_runs(e)
    return reply(slot, 'P', attempt, now, now)
  end
  if not file_answer(e, 'R', slot, now, values) then
    return known(e, now)
  end
  commit_entity(e, values, slot, now, #e.limits, limit_of)
  commit_budgets(e, slot, now)
  return reply(slot, 'R', decided_attempt(e), now, now)
end
