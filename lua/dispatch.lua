-- The dispatcher's once-only marker for one task's message, with the same lease discipline as the
-- limiter's answers: one attempt publishes at a time, a failed one releases, a finished one is
-- remembered (and its claim-checked payload deleted).
--
-- KEYS[1]  the dispatch marker        drip:{rule|key}:d:<message identity>
-- KEYS[2]  the claim-checked payload  drip:{rule|key}:p:<message identity> (may not exist)
-- Arguments, in order: 'claim' | 'done' | 'release', and a TTL in ms (claim: the lease; done: the
-- memory).
--
-- Returns for 'claim': 'acquired', 'busy' (another attempt holds the lease) or 'done'.
local op, ttl = str(), int()
local marker = redis.call('GET', KEYS[1])
if op == 'claim' then
  if marker == 'done' then
    return 'done'
  elseif marker then
    return 'busy'
  end
  redis.call('SET', KEYS[1], 'lease', 'PX', ttl)
  return 'acquired'
elseif op == 'done' then
  redis.call('SET', KEYS[1], 'done', 'PX', ttl)
  redis.call('DEL', KEYS[2])
  return 'done'
end
if marker ~= 'done' then
  redis.call('DEL', KEYS[1])
end
return 'released'
