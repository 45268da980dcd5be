-- Grants lock KEYS[1] to owner ARGV[1] for ARGV[2] ms if nobody holds it:
-- an arrival (Acquire's first attempt, TryAcquire). Given a fence counter
-- KEYS[2], it issues the grant's token in the same step (fence.lua, which
-- ends this script): a grant and its token are one atomic event, and all
-- keys share a hash slot. Without one (WithoutFence) a grant replies 0.
-- Refused, it replies -1 - the holder's pttl; the caller then queues
-- (wait.lua). While waiters queue, a release grants the key to the first
-- of them in the same step (release.lua), so the key is not free for an
-- arrival to take past them.
-- A value of our own owner, marked or not, is this very grant run again:
-- go-redis resends a command whose reply a dropped connection lost, and
-- the owner value is fresh per acquisition, so only its own grant wrote
-- it. That grant is answered again with its TTL as the first run set it
-- (the caller counts its lease from before the first send, so its lease
-- still ends first) and a fresh token: the key stayed ours since the
-- first run, so no other grant of it drew a token in between; the lost
-- token reached nobody, no store saw it; fence.lua gives one above it
-- (above the counter, which holds at least the lost one), and every later
-- grant draws above that in turn.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local held = redis.call('GET', KEYS[1])
  if held ~= ARGV[1] and held ~= ARGV[1] .. '!' then
    return -1 - math.max(redis.call('PTTL', KEYS[1]), 0)
  end
end
if not KEYS[2] then
  return 0
end
