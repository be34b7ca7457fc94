-- Store the action's result over our own reservation, and only over our own (compare-and-set).
--
-- A holder whose lease lapsed may finish after someone else reserved the key. A plain SET would
-- overwrite that caller's reservation with a stale result; this script leaves it alone.
--
-- KEYS[1]  the record
-- KEYS[2]  its fence counter
-- ARGV[1]  our owner token
-- ARGV[2]  the completed record, compact JSON
-- ARGV[3]  the result's TTL, in milliseconds
-- ARGV[4]  how long the counter must live at least, in milliseconds (TTL + retention)
--
-- Returns 1 if the result was stored (or is stored already: a sending of this script that
-- landed, whose reply was lost with its connection), 0 if the key no longer holds our
-- reservation.

local current = redis.call('GET', KEYS[1])
if not current then
  return 0 -- the lease lapsed and nobody took the key: do not resurrect it
end
-- A record we cannot decode, a record with another owner (or none: Python's), or a completed
-- record are all not ours.
local ok, record = pcall(cjson.decode, current)
if not ok or type(record) ~= 'table' or record.owner ~= ARGV[1] then
  return 0
end
if record.status == 'completed' then
  return 1 -- ours, completed: by an earlier sending of this very script
end
if record.status ~= 'pending' then
  return 0
end

redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
-- The counter outlives the result, so the next reservation after it expires still gets a
-- larger token than ours.
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1
