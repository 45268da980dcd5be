-- Grants KEYS[1] to owner ARGV[1] for ARGV[2] ms if nobody holds it, with
-- no fencing token: 0 on a grant, otherwise -1 - the holder's pttl. A
-- waiting caller passes KEYS[2] to ask for the release message
-- (wanted.lua). Only a waiter calls it: an unfenced arrival sends a plain
-- SET NX PX.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
return -1 - refused(KEYS[1], KEYS[2])
