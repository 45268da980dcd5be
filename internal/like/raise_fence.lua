-- Raises a liker set's fence by one at a reset: a holder that checked
-- before the reset wrote its token there, and write.lua lands only while
-- the fence still equals it, so its write after the reset is refused. The
-- next grant's token (one more, on a backend that counts by one) still
-- passes check.lua, which refuses only a lower token.
-- Compare-and-set, so that a resend after a lost reply changes nothing:
-- KEYS[1] the fence; ARGV[1] the value read, ARGV[2] that value plus one
-- (added by the caller: Lua's numbers would print 16 digits in exponent
-- form).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
