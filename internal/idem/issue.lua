-- Mints a token for one user, unless the user already holds the maximum.
-- KEYS[1] the user's index of live tokens (a sorted set, score = expiry ms)
-- KEYS[2] the new token's record (same hash slot: the user's hash tag)
-- ARGV[1] now (ms), ARGV[2] the token's expiry (ms), ARGV[3] TTL (ms),
-- ARGV[4] the cap, ARGV[5] the index member naming the record
-- Returns {1} when minted, {0, oldest expiry ms} when the cap is reached.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, oldest[2]}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[5])
-- The newest token expires last: the index lives exactly as long as it.
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[2], 'issued', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {1}
