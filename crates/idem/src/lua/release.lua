-- Delete our own reservation, and only our own (compare-and-delete).
--
-- A holder whose lease lapsed may fail after someone else reserved the key. A plain DEL would
-- delete that caller's reservation and let a third caller run alongside it.
--
-- KEYS[1]  the record
-- ARGV[1]  our owner token
--
-- Returns 1 if deleted, 0 if the key no longer holds our reservation.

local current = redis.call('GET', KEYS[1])
if not current then
  return 0
end
local ok, record = pcall(cjson.decode, current)
if not ok or type(record) ~= 'table' or record.owner ~= ARGV[1] or record.status ~= 'pending' then
  return 0
end

redis.call('DEL', KEYS[1])
return 1
