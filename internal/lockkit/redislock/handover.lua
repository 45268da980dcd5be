-- Releases a plain lease of owner ARGV[1] on KEYS[1] and, when the
-- releasing process has a waiter of its own, grants it to that waiter in
-- the same step: owner ARGV[2] for ARGV[3] ms, its token from KEYS[2]
-- (fence.lua, which ends this script). A local hand-off so costs one round
-- trip, not a release and then the waiter's acquire. A waiter elsewhere
-- marks the lease (acquire.lua); a marked lease is still handed on here
-- while the process's run of hand-offs lasts (ARGV[4] = '1', the mark
-- passed on to the new owner), and then freed and the waiters told, as
-- release.lua does: that is what keeps the key from staying in one process
-- while others wait.
-- Returns the fence on a hand-over, -1 if freed, 0 if not ours.
local held, mark = redis.call('GET', KEYS[1]), ''
-- The new owner's value, marked or not, is this hand-over run already and
-- resent by go-redis after its reply was lost (the new owner is fresh, so
-- nothing else wrote it): answered again with its TTL as set and a fresh
-- token, as acquire.lua answers its own resent grant (see there why that
-- is safe).
if held ~= ARGV[2] and held ~= ARGV[2] .. '!' then
  if held ~= ARGV[1] then
    if held ~= ARGV[1] .. '!' then
      return 0
    end
    if ARGV[4] ~= '1' then
      redis.call('DEL', KEYS[1])
      redis.call('PUBLISH', KEYS[1] .. ':released', '')
      return -1
    end
    mark = '!'
  end
  -- Ours: no NX. The new owner is fresh, so a clean-up of a hand-over
  -- whose reply was lost cannot free a grant made otherwise.
  redis.call('SET', KEYS[1], ARGV[2] .. mark, 'PX', ARGV[3])
end
