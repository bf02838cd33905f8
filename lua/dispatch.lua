-- The dispatcher's once-only markers for tasks' messages, with the same lease discipline as the
-- limiter's answers: one attempt publishes at a time, a failed one releases, a finished one is
-- remembered (and its claim-checked payload deleted). One call carries one or more operations
-- (drip-store groups those that arrive together), each on its own message.
--
-- KEYS, two per operation in order: the dispatch marker drip:{rule|key}:d:<message identity>, and
-- the claim-checked payload drip:{rule|key}:p:<message identity> (may not exist).
-- Arguments: the count of operations, then for each 'claim' | 'done' | 'release' and a TTL in ms
-- (claim: the lease; done: the memory).
--
-- Returns, per operation in order: for 'claim' 'acquired', 'busy' (another attempt holds the
-- lease) or 'done'; for 'done' 'done'; for 'release' 'released'.
local function operate(marker_key, payload_key, op, ttl)
  local marker = redis.call('GET', marker_key)
  if op == 'claim' then
    if marker == 'done' then
      return 'done'
    elseif marker then
      return 'busy'
    end
    redis.call('SET', marker_key, 'lease', 'PX', ttl)
    return 'acquired'
  elseif op == 'done' then
    redis.call('SET', marker_key, 'done', 'PX', ttl)
    redis.call('DEL', payload_key)
    return 'done'
  end
  if marker ~= 'done' then
    redis.call('DEL', marker_key)
  end
  return 'released'
end

local results = {}
for i = 1, int() do
  local op, ttl = str(), int()
  results[i] = operate(KEYS[2 * i - 1], KEYS[2 * i], op, ttl)
end
return results
