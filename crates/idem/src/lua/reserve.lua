-- Reserve an idempotency key and draw a fencing token, or return the record that holds the key.
-- One round trip, atomic: Redis runs a script without interleaving other commands.
--
-- KEYS[1]  the record:         <prefix><operation>:<key>
-- KEYS[2]  its fence counter:  in the record's hash slot (see `fence_key` in key.rs)
-- ARGV[1]  our pending record, compact JSON without a "fence" field
-- ARGV[2]  the lease, in milliseconds
-- ARGV[3]  how long the counter must live at least, in milliseconds (lease + retention)
--
-- Returns the stored record (a string) if the key is taken, or our fencing token (an integer).

local existing = redis.call('GET', KEYS[1])
if existing then
  return existing
end

-- INCR creates the counter at 1 and only ever goes up, so every reservation of this key gets a
-- larger token than all earlier ones, for as long as the counter lives; hence the expiry is only
-- ever pushed later, never shortened.
local fence = redis.call('INCR', KEYS[2])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end

-- The record's JSON ends with '}': drop it and append the token as the last field, so the record
-- shows which fence its action was given. Python's model ignores the extra field. '%d', because
-- Lua 5.1 would print a large number as 1e+14.
local record = string.sub(ARGV[1], 1, -2) .. ',"fence":' .. string.format('%d', fence) .. '}'
redis.call('SET', KEYS[1], record, 'PX', ARGV[2])
return fence
