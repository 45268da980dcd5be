-- A queued waiter's look at lock KEYS[1] (fence KEYS[2]): Acquire's after
-- its arrival was refused, and again whenever the waiter is told to look
-- (release.lua's message), or its wait for one has passed. KEYS[3] is the
-- key's queue of waiters in arrival order, KEYS[4] each one's deadline.
-- ARGV: owner, waiter timeout ms. A waiting owner names the Locker it
-- waits in, its claim window and the lease it asks for (next.lua): they
-- travel with its place in the queue.
--
-- Reserved for the waiter (a release granted it the key for the claim
-- window and told it), the look claims the key for the waiter's lease.
-- Otherwise it takes or keeps the waiter's place, its deadline now +
-- the waiter timeout, and marks a holder's value with a trailing '!',
-- which asks its release to hand the key on (release.lua); the mark lives
-- and dies with the lease it asks about (APPEND keeps the TTL). Refused,
-- it replies {the ms to wait at most (the holder's remaining lease), the
-- key's last token, the server's TIME}: a grant told to the waiter later
-- carries a token above that one and at least that time in microseconds
-- (fence.lua), and one that does not was made before this look and is
-- spent (inbox.trusted). A free key goes to the queue's first live waiter
-- (next.lua), which may be the caller. A grant replies {owner, token}
-- (fence.lua).
local owner, timeout = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('GET', KEYS[1])
local grantee, refused
if held == owner or held == owner .. '!' then
  -- Claimed. A look resent by go-redis after its reply was lost lands
  -- here too, and is answered as the grant again (see acquire.lua).
  redis.call('PEXPIRE', KEYS[1], string.match(owner, '(%d+)$'))
  grantee = owner
else
  if not redis.call('ZSCORE', KEYS[4], owner) then
    redis.call('RPUSH', KEYS[3], owner)
  end
  redis.call('ZADD', KEYS[4], ms + timeout, owner)
  -- The queue disappears by itself once every waiter has gone silent.
  redis.call('PEXPIRE', KEYS[3], 2 * timeout)
  redis.call('PEXPIRE', KEYS[4], 2 * timeout)
  if held then
    if string.sub(held, -1) ~= '!' then
      redis.call('APPEND', KEYS[1], '!')
    end
    return {math.max(redis.call('PTTL', KEYS[1]), 0), redis.call('GET', KEYS[2]) or '0', t[1], t[2]}
  end
end
