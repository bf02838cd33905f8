-- One call: the leases' credits, then each event in order, by the lean path or the general one.

-- The call's last lean event written in full (what an event written as `=` is like), and its
-- last general one (what an event written as `~` is like).
local last_lean, last_full

-- The event at the cursor, read as it is written: like the last lean one (read_like), lean
-- (read_lean), like the last general one (read_alike) or whole (read_event).
local function read_next()
  local mark = ARGV[arg_at + 1]
  if mark == '=' then
    return read_like(last_lean)
  elseif mark == '~' then
    return read_alike(last_full)
  elseif ARGV[arg_at + EVENT_MODE] == 'lean' then
    local e = read_lean()
    if e.lean then
      last_lean = e
    end
    return e
  end
  last_full = read_event()
  return last_full
end

local function decide_next(e, now)
  if e.lean then
    return decide_lean(e, now)
  end
  return decide(e, now)
end

-- One call: the leases' credits, then each event in order. Everything a call keeps starts afresh
-- (this file runs as a function library, whose top level runs once; scripts.rs's wrapper resets
-- the argument cursor).
local function main()
  reads, answers, writes, ring_lives, drain_wakes, last_lean, last_full = {}, {}, {}, {}, {}, false, false
  local now = clock(int())
  for _ = 1, int() do
    credit(now)
  end
  local count = int()
  if count == 1 then
    -- An event alone shares nothing: no sharing tables, and its reply is the call's.
    local decided = decide_next(read_next(), now)
    flush_writes()
    return decided
  end
  local events = {}
  for i = 1, count do
    events[i] = read_next()
  end
  share(events)
  local replies = {}
  for i = 1, #events do
    local decided = decide_next(events[i], now)
    if decided.err then
      -- What the events before it decided stands (their answers are filed): so does their state.
      flush_writes()
      return decided
    end
    local n = #replies
    for j = 1, REPLY_LENGTH do
      replies[n + j] = decided[j]
    end
    if decided[2] == STATUS.W then
      -- The events after it wait for its lease: the caller sends them again with it.
      break
    end
  end
  flush_writes()
  return replies
end
