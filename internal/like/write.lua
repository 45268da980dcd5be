-- The lock strategy's membership write, fenced: it lands only while the
-- set still carries the token its check claimed (check.lua). A newer
-- holder's check claims a higher token, which refuses this write even if
-- the newer holder has not written yet.
-- KEYS[1] the entity's liker set, KEYS[2] the entity's fence (same slot)
-- ARGV[1] user id, ARGV[2] "add" or "rem", ARGV[3] fencing token, 0 = unfenced
-- Returns SADD's or SREM's reply, or -1 when the token is no longer the set's.
local token = tonumber(ARGV[3])
if token > 0 and token ~= tonumber(redis.call('GET', KEYS[2]) or '0') then
  return -1
end
if ARGV[2] == 'add' then
  return redis.call('SADD', KEYS[1], ARGV[1])
end
return redis.call('SREM', KEYS[1], ARGV[1])
