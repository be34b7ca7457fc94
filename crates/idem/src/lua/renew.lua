-- Extend our own reservation while the action runs (compare-and-set).
--
-- The pending record is rewritten, not just given a longer TTL: its "expires_at" must move too,
-- because idempotency-kit treats a record whose "expires_at" has passed as abandoned (and deletes
-- it) whatever Redis's TTL says.
--
-- KEYS[1]  the record
-- KEYS[2]  its fence counter
-- ARGV[1]  our owner token
-- ARGV[2]  our pending record with the new "expires_at", compact JSON
-- ARGV[3]  the lease, in milliseconds
-- ARGV[4]  how long the counter must live at least, in milliseconds (lease + retention)
--
-- Returns 1 if renewed, 0 if the key no longer holds our reservation (then nothing is written,
-- so a renewal that arrives late can never land on a result or on someone else's reservation).

local current = redis.call('GET', KEYS[1])
if not current then
  return 0
end
local ok, record = pcall(cjson.decode, current)
if not ok or type(record) ~= 'table' or record.owner ~= ARGV[1] or record.status ~= 'pending' then
  return 0
end

redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1
