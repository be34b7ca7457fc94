-- wrk script of the storm (README, "Benchmarks"): POST /reports over 100 Idempotency-Keys,
-- a key drawn at random for each request, the payload fixed by the key (so every replay is a
-- true replay, 200, and the first request of a key is 201). Answers that are not 2xx are
-- counted by wrk and printed: the storm is only a measurement when there are none. (No
-- `response` callback: wrk would run Lua for every answer, CPU taken from the service.)
math.randomseed(os.time())

request = function()
  local k = math.random(0, 99)
  local body = string.format('{"task_id":%d,"report_type":"storm"}', k + 1)
  return wrk.format("POST", "/reports",
    { ["Content-Type"] = "application/json", ["Idempotency-Key"] = "storm-" .. k }, body)
end

done = function(summary, latency, requests)
  io.write(string.format("requests_per_sec %.1f\nnon_2xx %d\nsocket_errors %d\n",
    summary.requests / (summary.duration / 1e6), summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
