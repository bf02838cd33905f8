-- The baseline `./run bench` compares reserve.lua with: the token bucket of seed 001
-- (shared/seeds/001_*.txt, scripts/token_bucket.lua), as that article writes it. Admission only:
-- it answers allowed or not and schedules nothing.
--
-- KEYS[1]: rate_limit:{user_id}
-- ARGV[1]: capacity (max burst)
-- ARGV[2]: refill_rate (tokens/sec)
-- ARGV[3]: now (unix timestamp in seconds)
-- ARGV[4]: requested_tokens

local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local refill_rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])

local data = redis.call('HMGET', key, 'tokens', 'last_updated')
local tokens = tonumber(data[1])
local last_updated = tonumber(data[2])

if tokens == nil then
    tokens = capacity
    last_updated = now
else
    local delta = math.max(0, now - last_updated)
    tokens = math.min(capacity, tokens + delta * refill_rate)
    last_updated = now
end

if tokens >= requested then
    tokens = tokens - requested
    redis.call('HMSET', key, 'tokens', tokens, 'last_updated', last_updated)
    redis.call('EXPIRE', key, math.ceil(capacity / refill_rate) * 2)
    return 1 -- Allowed
else
    return 0 -- Rate limited
end
