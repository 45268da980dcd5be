-- Keeps a finished request's response on its token, once.
-- KEYS[1] the token's record
-- ARGV[1] fingerprint, ARGV[2] status, ARGV[3] headers (JSON), ARGV[4] body
-- Returns 1 when stored; 0 when the token expired meanwhile (HSET would
-- recreate it without a TTL) or a response is already there (a lease lost
-- half-way let a duplicate run: the first answer stays the answer).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if redis.call('HEXISTS', KEYS[1], 'status') == 1 then
  return 0
end
-- HSET keeps the key's TTL: the token expires when it was issued to.
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'status', ARGV[2], 'header', ARGV[3], 'body', ARGV[4])
return 1
