-- A throttled key's backlog parks: its queue, when an event parks instead of booking, and the
-- drain that books the queue's head at the counts in force.

-- The queue of the entity's parked messages, oldest first: a list beside its state hash
-- ('<prefix>:state' -> '<prefix>:q'); `<prefix>:h` lists those a drain took and is handing over.
-- An entry names its message: its answers hash, a newline and its field (8 bytes). A message
-- parked by a call that carried its body keeps the body in its entry, after the name and its
-- length: '\0<length>\n<name><body>' (keys.rs's EntryBody); one whose body is kept after the
-- call has its name alone, and its body at '<answers hash>:q:<field>'.
local function queue_key(e)
  return string.sub(KEYS[e.base + KEY_STATE], 1, -6) .. 'q'
end

local function queue_entry(e)
  return KEYS[e.base + KEY_ANSWERS] .. '\n' .. e.field
end

-- What an entry of the message named `name` that keeps its body starts with.
local function entry_with_body(name)
  return '\0' .. #name .. '\n' .. name
end

-- Where the state's 'q' (how many messages are parked) sits among its fields; 'wk' follows it.
local function parked_at(e)
  return STATE_HEAD + 2 * #e.limits + STATE_PARKED
end

-- Sets 'q' and 'wk' (false: none) in the state and in `values` (a cached state's next event);
-- with `changes`, adds them to those instead, which the caller writes.
local function set_parked(e, values, parked, wake, changes)
  local at = parked_at(e)
  values[at], values[at + STATE_WAKE - STATE_PARKED] = parked, wake
  if changes then
    local c = #changes
    changes[c + 1], changes[c + 2], changes[c + 3], changes[c + 4] = FIELD_PARKED, parked, FIELD_WAKE, wake or ''
  else
    e.state.write(e, {FIELD_PARKED, parked, FIELD_WAKE, wake or ''}, false)
  end
end

-- Whether an event whose earliest slot is `slot` parks (schedule.rs's parks): messages of the key
-- are parked already, or the key or one of its budgets is throttled (paused, or its level below
-- the ceiling) and the slot lies past the park horizon, or a fair budget's near horizon lies
-- before the slot (book near, park far).
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
    if budget.near > 0 and slot > now + budget.near then
      return true
    end
  end
  return throttled and slot > now + e.park
end

-- Appends the message (its earliest slot `slot`) to the key's queue, keeping its body when the
-- call carries it, and at the key's first park the key to its fair budget's ring (schedule.rs's
-- decide: in the same call, so a parked key is in the ring; a key parked before its rule's budget
-- was fair joins when its queue has emptied), arming the ring's drain where the slot comes within
-- the budget's near horizon unless a wake is armed: its reply's attempt (flagged REPLY_ARMED when
-- it armed one). The queue and the state live while it may wait there (its answer's life), and are
-- given a quarter more when they are set to, so that most parks set no expiry: the state's 'exp'
-- (so that no commit shortens its life) and 'qx' (the queue's) say until when each is kept.
local function park(e, values, slot, now)
  local queue, at = queue_key(e), parked_at(e)
  local parked = tonumber(values[at]) or 0
  local entry = queue_entry(e)
  if e.body ~= '' then
    entry = entry_with_body(entry) .. e.body
  end
  local new = QUEUE.push(queue, entry)
  local attempt = ATTEMPT.decided
  for b = 1, #e.budgets do
    local budget = e.budgets[b]
    if budget.ring_key then
      RING.join(KEYS[e.base + budget.ring_key], parked == 0 and budget.ring_member, now, e.answers_keep)
      if RING.arm(KEYS[e.base + budget.ring_key + 1], now, slot - budget.near) then
        attempt = attempt + REPLY_ARMED
      end
    end
  end
  local changes = {}
  set_parked(e, values, parked + 1, tonumber(values[at + STATE_WAKE - STATE_PARKED]) or false,
    changes)
  local keep, kept = now + e.answers_keep, now + e.answers_keep + math.floor(e.answers_keep / 4)
  local state_longer = (tonumber(values[STATE_EXPIRES]) or 0) < keep
  if state_longer then
    values[STATE_EXPIRES] = kept
    changes[#changes + 1], changes[#changes + 2] = FIELD_EXPIRES, kept
  end
  local queue_at = at + STATE_QUEUE_EXPIRES - STATE_PARKED
  local queue_kept = tonumber(values[queue_at]) or 0
  if queue_kept < keep then
    queue_kept, values[queue_at] = kept, kept
    changes[#changes + 1], changes[#changes + 2] = FIELD_QUEUE_EXPIRES, kept
    HASH.keep(queue, kept - now)
  elseif new then
    -- A queue emptied (and so deleted) since 'qx' was set.
    HASH.keep(queue, queue_kept - now)
  end
  e.state.write(e, changes, false)
  if state_longer then
    HASH.keep(KEYS[e.base + KEY_STATE], kept - now, 'GT')
  end
  return attempt
end

-- The drain of the key's parked messages at this one (schedule.rs's unpark): at the head of the
-- queue, the slot it gets now, reserved if no later than the deadline (`e.park`) and it leaves the
-- queue; else it stays and the drain wakes again ('wk'). Parked longer than its max_delay (from
-- when it was parked) or over a limit in force, it leaves with nothing reserved.
local function unpark(e, now)
  local queue, entry = queue_key(e), queue_entry(e)
  local recorded = e.answers.get(e)
  local kind, _, decided = parse_answer(recorded or '')
  -- The queue's head leaves it for the list of messages being handed over (a task made for its
  -- slot, or a dead letter), until the drain says it is (RedisStore's handed_over): a drain that
  -- crashes between the two leaves it there for the next one. It moves first, which reads the head
  -- too, and moves back when it is not this message or stays.
  local handing = string.sub(queue, 1, -2) .. 'h'
  local moved = QUEUE.move_head(queue, handing)
  local head = moved == entry
  if moved and not head and string.byte(moved, 1) == 0 then
    local with_body = entry_with_body(entry)
    head = string.sub(moved, 1, #with_body) == with_body
  end
  local stays = function()
    QUEUE.move_back(queue, handing)
  end
  if moved and not head then
    stays()
  end
  local since
  if kind == 'P' then
    since = e.answers_base + tonumber(decided)
  elseif not recorded and head then
    -- Its answer expired: the drain stopped for longer than max_delay and the margin.
    since = EXPIRED_PARK
  elseif not recorded then
    -- It may wait further back: without its answer, only the whole queue could tell.
    return {0, NOT_HEAD, 0, now, 0}
  else
    -- It was decided: it left the queue.
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
  local parked, wake = tonumber(values[at]) or 0, tonumber(values[at + STATE_WAKE - STATE_PARKED]) or false
  -- It has left the queue: its state counts one parked fewer. With `changes`, its state's new
  -- counts are added to those (the booking's, written in one HSET).
  local leaves = function(changes)
    HASH.keep(handing, e.answers_keep)
    if parked <= 1 then
      set_parked(e, values, 0, false, changes)
    else
      set_parked(e, values, parked - 1, wake, changes)
    end
  end
  if not read_budgets(e, now) or not counts_in_force(e, now) then
    leaves()
    file_answer(e, 'C', now, now, false)
    return reply(now, 'C', ATTEMPT.decided, now, now)
  end
  local slot, horizon = search(e, values, last, now)
  if slot == false and e.wanted.window > deadline then
    -- A drain leases only windows it may book now (schedule.rs's search): its partition's pool is
    -- short past the deadline, so the head stays, its slot at least that window.
    slot = e.wanted.window
  elseif slot == false then
    -- Its partition's pool of a leased budget has no units for it: the drain asks the home for no
    -- window past the deadline and sends it again (nothing of it written).
    e.max_delay = math.min(e.max_delay, deadline - now)
    stays()
    return lease_wanted(e, now)
  elseif not slot then
    stays()
    return redis.error_reply('drip: slot search did not settle')
  else
    keep_runs(e)
  end
  if slot > horizon then
    leaves()
    file_answer(e, 'L', slot, now, false)
    return reply(slot, 'L', ATTEMPT.decided, now, now)
  elseif slot > deadline then
    wake = math.min(math.max(slot - (deadline - now), now), now + MAX_WAKE_GAP)
    set_parked(e, values, parked, wake)
    stays()
    return {slot, LATER, wake, now, 0}
  end
  local changes = {}
  leaves(changes)
  file_answer(e, 'R', slot, now, values)
  commit_entity(e, values, slot, now, #e.limits, limit_of, changes)
  commit_budgets(e, slot, now)
  return reply(slot, 'R', decided_attempt(e), now, now)
end
