-- Frees a token whose request ended without a response worth keeping
-- (a 5xx, a malformed request), so that it can run again, with any body.
-- KEYS[1] the token's record
-- A response stored meanwhile (by a duplicate that ran after a lost lease)
-- keeps its fingerprint.
if redis.call('HEXISTS', KEYS[1], 'status') == 0 then
  redis.call('HDEL', KEYS[1], 'fp')
end
return 1
