-- Binds a token to the first request that runs with it.
-- KEYS[1] the token's record; ARGV[1] fingerprint
-- Returns 1, or 0 when the token has expired (HSET would recreate it
-- without a TTL).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'fp', ARGV[1])
return 1
