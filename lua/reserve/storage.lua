-- The storage seam: where an event's entity state and message answer are read and written
-- (straight to Redis, or through the call's reads and writes when a call's events share hashes),
-- and the writes a call makes when it ends.

-- Within one call, each hash is read once and written once, however many of its events the call
-- holds: an entity's state and overrides (key -> {from, to, values}: the fields as this call left
-- them), the messages' answers (answers key -> field -> answer, or false for none), and the writes
-- still to make (key -> {fields, order, ttl}), made when the call ends; the life this call saw or
-- gave a fair budget's ring (key -> ms from now), and the wake it saw or armed of a ring's drain
-- (its hash -> the wake, false for none).
local reads, answers, writes, ring_lives, drain_wakes

-- An entity's overrides when it has none (never written to).
local NO_OVERRIDES = {}

-- HMGET of ARGV[from..to], or what this call read (and changed) of the same fields before.
local function hmget(key, from, to)
  local cached = reads[key]
  if cached and cached.from == from and cached.to == to then
    -- The same names (a burst's events share their first one's record).
    return cached.values
  elseif cached and cached.to - cached.from == to - from then
    local same, offset = true, cached.from - from
    for i = from, to do
      if ARGV[i] ~= ARGV[i + offset] then
        same = false
        break
      end
    end
    if same then
      return cached.values
    end
  end
  local values = redis.call('HMGET', key, unpack(ARGV, from, to))
  reads[key] = {from = from, to = to, values = values}
  return values
end

-- Sets the fields `changes` (name, value, ...) of hash `key` when the call ends; `ttl`: a PEXPIRE
-- after (the longest asked for).
local function write_hash(key, changes, ttl)
  local pending = writes[key]
  if not pending then
    pending = {fields = {}, order = {}, ttl = false}
    writes[key] = pending
  end
  for i = 1, #changes, 2 do
    local name = changes[i]
    if pending.fields[name] == nil then
      pending.order[#pending.order + 1] = name
    end
    pending.fields[name] = changes[i + 1]
  end
  if ttl and (not pending.ttl or ttl > pending.ttl) then
    pending.ttl = ttl
  end
end

local function flush_writes()
  for key, pending in pairs(writes) do
    local set = {}
    for i = 1, #pending.order do
      local name = pending.order[i]
      set[2 * i - 1], set[2 * i] = name, pending.fields[name]
    end
    if #set > 0 then
      redis.call('HSET', key, unpack(set))
    end
    if pending.ttl then
      redis.call('PEXPIRE', key, pending.ttl)
    end
  end
  writes = {}
end

-- Where an event's entity state and message answer are read and written: the storage its
-- arithmetic sees, chosen once per event by `share`. PLAIN goes straight to Redis (an event alone
-- with its hashes: the call's tables would cost more than they save); CACHED goes through the
-- call's reads and writes above, so that the call's next event of the same entity or answers hash
-- sees what this one left.
local PLAIN_STATE, CACHED_STATE = {}, {}

-- The entity's state fields (ARGV[state_from..state_to]), as the call left them.
function PLAIN_STATE.read(e)
  return redis.call('HMGET', KEYS[e.base + KEY_STATE], unpack(ARGV, e.state_from, e.state_to))
end

function CACHED_STATE.read(e)
  return hmget(KEYS[e.base + KEY_STATE], e.state_from, e.state_to)
end

-- Sets the state fields `changes` (name, value, ...); `ttl`: a PEXPIRE after, or false.
function PLAIN_STATE.write(e, changes, ttl)
  if #changes > 0 then
    redis.call('HSET', KEYS[e.base + KEY_STATE], unpack(changes))
  end
  if ttl then
    redis.call('PEXPIRE', KEYS[e.base + KEY_STATE], ttl)
  end
end

function CACHED_STATE.write(e, changes, ttl)
  write_hash(KEYS[e.base + KEY_STATE], changes, ttl)
end

local PLAIN_ANSWERS, CACHED_ANSWERS = {}, {}

-- The message's answer if this call read it ahead (`share`), else false: nothing to ask Redis.
function PLAIN_ANSWERS.ahead()
  return false
end

function CACHED_ANSWERS.ahead(e)
  return answers[KEYS[e.base + KEY_ANSWERS]][e.field]
end

-- The message's answer (false for none), and the value of the field `also` of its answers hash
-- when asked, in one read.
function PLAIN_ANSWERS.get(e, also)
  if also then
    local held = redis.call('HMGET', KEYS[e.base + KEY_ANSWERS], e.field, also)
    return held[1], held[2]
  end
  return redis.call('HGET', KEYS[e.base + KEY_ANSWERS], e.field)
end

function CACHED_ANSWERS.get(e, also)
  local key = KEYS[e.base + KEY_ANSWERS]
  return answers[key][e.field], also and redis.call('HGET', key, also)
end

-- Sets the message's answer `value`, replacing any (`ttl`: a PEXPIRE of the answers hash after).
function PLAIN_ANSWERS.set(e, value, ttl)
  local key = KEYS[e.base + KEY_ANSWERS]
  redis.call('HSET', key, e.field, value)
  if ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end

function CACHED_ANSWERS.set(e, value, ttl)
  local key = KEYS[e.base + KEY_ANSWERS]
  write_hash(key, {e.field, value}, ttl)
  answers[key][e.field] = value
end

-- Files the message's first answer: false (and nothing written) when it has one already. The
-- plain way asks Redis with HSETNX, so a new message costs no read of its answer; a cached
-- hash's answers were read ahead, so `decide` has replayed a known one before it gets here.
function PLAIN_ANSWERS.file(e, value, ttl)
  local key = KEYS[e.base + KEY_ANSWERS]
  if redis.call('HSETNX', key, e.field, value) == 0 then
    return false
  end
  if ttl then
    redis.call('PEXPIRE', key, ttl)
  end
  return true
end

function CACHED_ANSWERS.file(e, value, ttl)
  CACHED_ANSWERS.set(e, value, ttl)
  return true
end

-- Every other hash, sorted set and list of the reservation: budget calendars and pools, a
-- sliding limit's slots, a key's queue of parked messages. What each room asks of them, named; only
-- this room calls Redis.
local HASH, SLOTS, QUEUE, RING = {}, {}, {}, {}

-- A budget limit's window as `read(budget, l, window)` gives it (what it holds, and beside it a
-- calendar's parts by floor or a pool's lease), read once per call: `l.used` and `l.beside` keep
-- it, and a change of the window clears its `l.used`.
local function window_once(budget, l, window, read)
  local used = l.used[window]
  if used then
    return used, l.beside[window]
  end
  local beside
  used, beside = read(budget, l, window)
  l.used[window], l.beside[window] = used, beside
  return used, beside
end

function HASH.get(key, field)
  return redis.call('HGET', key, field)
end

-- The values of the fields `names` (a list), in order.
function HASH.get_all(key, names)
  return redis.call('HMGET', key, unpack(names))
end

-- The values of the fields named by ARGV[from..to], in order.
function HASH.get_span(key, from, to)
  return redis.call('HMGET', key, unpack(ARGV, from, to))
end

-- Sets the fields `changes` (name, value, ...), none when empty.
function HASH.set(key, changes)
  if #changes > 0 then
    redis.call('HSET', key, unpack(changes))
  end
end

function HASH.add(key, field, units)
  redis.call('HINCRBY', key, field, units)
end

-- Sets the field unless it is set: whether it was not.
function HASH.set_new(key, field, value)
  return redis.call('HSETNX', key, field, value) == 1
end

function HASH.remove(key, field)
  redis.call('HDEL', key, field)
end

-- Any key's life: `ttl` ms from now (`mode` 'GT': only longer), for ever, or what is left of it.
function HASH.keep(key, ttl, mode)
  if mode then
    redis.call('PEXPIRE', key, ttl, mode)
  else
    redis.call('PEXPIRE', key, ttl)
  end
end

function HASH.keep_for_ever(key)
  redis.call('PERSIST', key)
end

function HASH.life(key)
  return redis.call('PTTL', key)
end

function HASH.delete(key)
  redis.call('DEL', key)
end

-- A sliding limit's slots: members are slot times, scores the running total of cost up to each.
-- The newest `n` as {member, score, ...}, oldest first; the oldest one.
function SLOTS.newest(key, n)
  return redis.call('ZRANGE', key, -n, -1, 'WITHSCORES')
end

function SLOTS.oldest(key)
  return redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
end

-- The first slot whose total is at least `total`, or nil.
function SLOTS.first_from(key, total)
  return redis.call('ZRANGEBYSCORE', key, total, '+inf', 'LIMIT', 0, 1)[1]
end

function SLOTS.put(key, slot, total)
  redis.call('ZADD', key, total, slot)
end

function SLOTS.remove(key, slot)
  redis.call('ZREM', key, slot)
end

-- A queue of parked messages, oldest first. Whether the queue is new (it was empty).
function QUEUE.push(key, entry)
  return redis.call('RPUSH', key, entry) == 1
end

-- Moves the head of `from` to the end of `to`: the entry moved, or false (`from` was empty).
function QUEUE.move_head(from, to)
  return redis.call('LMOVE', from, to, 'LEFT', 'RIGHT')
end

-- Moves the end of `to` back to the head of `from` (undoes move_head).
function QUEUE.move_back(from, to)
  redis.call('LMOVE', to, from, 'RIGHT', 'LEFT')
end

-- A fair budget's ring of waiting keys (lua/fair.lua reads and trims it): `member` joins it once,
-- by when it joined (false: it is in it), and the ring lives `keep` more at least. A call asks the
-- ring's life once and remembers what it gave it.
function RING.join(key, member, now, keep)
  if member then
    redis.call('ZADD', key, 'NX', now, member)
  end
  local life = ring_lives[key] or redis.call('PTTL', key)
  if life < keep then
    redis.call('PEXPIRE', key, keep)
    life = keep
  end
  ring_lives[key] = life
end

-- Arms the drain of a ring (`drain`: its hash, whose 'wk' is when it wakes) at `wanted`, no earlier
-- than now and at most MAX_WAKE_GAP ahead, unless a wake is armed and not lost (WAKE_LOST_AFTER;
-- schedule/fair.rs's arm): whether it armed one. The hash does not expire: one per fair budget
-- (or partition), whose loss would arm a second wake while the first still runs.
function RING.arm(drain, now, wanted)
  local wake = drain_wakes[drain]
  if wake == nil then
    wake = tonumber(redis.call('HGET', drain, FIELD_WAKE)) or false
  end
  if wake and wake + WAKE_LOST_AFTER >= now then
    drain_wakes[drain] = wake
    return false
  end
  wake = math.min(math.max(wanted, now), now + MAX_WAKE_GAP)
  redis.call('HSET', drain, FIELD_WAKE, wake)
  drain_wakes[drain] = wake
  return true
end
