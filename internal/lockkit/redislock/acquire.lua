-- Grants KEYS[1] to owner ARGV[1] for ARGV[2] ms if nobody holds it, and
-- issues the grant's fencing token from KEYS[2] in the same step: a grant
-- and its token are one atomic event, and all keys share a hash slot.
-- Returns the fence, or -1 - the holder's pttl (fence.lua).
-- A caller that will wait for the release message if refused passes
-- KEYS[3], which asks the holder's release to send one (wanted.lua).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return next_fence(KEYS[2])
end
return -1 - refused(KEYS[1], KEYS[3])
