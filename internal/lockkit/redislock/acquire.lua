-- Grants KEYS[1] to owner ARGV[1] for ARGV[2] ms if nobody holds it, and
-- issues the grant's fencing token from KEYS[2] in the same step: a grant
-- and its token are one atomic event, and both keys share a hash slot.
-- Returns {fence, 0} on a grant, {0, pttl of the holder} otherwise.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {next_fence(KEYS[2]), 0}
end
return {0, redis.call('PTTL', KEYS[1])}
