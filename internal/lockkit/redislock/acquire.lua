-- Grants lock KEYS[1] to owner ARGV[1] for ARGV[2] ms if nobody holds it.
-- Given a fence counter KEYS[2], it issues the grant's token in the same
-- step (fence.lua, which ends this script): a grant and its token are one
-- atomic event, and all keys share a hash slot. Without one (WithoutFence)
-- a grant replies 0.
-- Refused, it replies -1 - the holder's pttl. A caller that will wait for
-- the release message passes ARGV[3] = '1' and marks the holder's value
-- with a trailing '!', which asks its release to send one (release.lua).
-- The mark lives and dies with the lease it asks about, so that an
-- uncontended release touches one key and sends nothing; a waiter calls
-- again when the lease runs out (a crashed holder sends no message), and
-- that call marks the next holder.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] and string.sub(redis.call('GET', KEYS[1]), -1) ~= '!' then
    redis.call('APPEND', KEYS[1], '!')
  end
  return -1 - math.max(redis.call('PTTL', KEYS[1]), 0)
end
if not KEYS[2] then
  return 0
end
