-- One owner's drift under the hash-tag strategy, read atomically: all of an
-- owner's keys are in one slot, so this is a true snapshot.
-- KEYS[1] the owner's received counter, KEYS[2..] the liker sets of the
-- owner's entities. Returns counter - sum of the set sizes.
local drift = tonumber(redis.call('GET', KEYS[1]) or '0')
for i = 2, #KEYS do
  drift = drift - redis.call('SCARD', KEYS[i])
end
return drift
