-- wrk script for ./run bench: Pub/Sub push envelopes with a unique message id per request, over
-- DRIP_BENCH_KEYS keys (10,000), for the rule "bench" (bench/rules-*.yaml).
local counter = 0
local keys = tonumber(os.getenv("DRIP_BENCH_KEYS") or "") or 10000
-- Each wrk run must send ids no earlier run sent (a repeated id is a cheaper redelivery).
math.randomseed(os.time() * 1000 + math.floor(os.clock() * 1000000))

function setup(thread)
  thread:set("prefix", tostring(math.random(1, 1000000000)))
end

request = function()
  counter = counter + 1
  local body = '{"message":{"data":"eyJtZXJjaGFudCI6MX0=","attributes":{"event_type":"bench","key":"k'
    .. (counter % keys) .. '"},"messageId":"' .. prefix .. '-' .. counter
    .. '"},"subscription":"projects/drip-bench/subscriptions/bench"}'
  return wrk.format("POST", "/push", {["Content-Type"] = "application/json"}, body)
end

