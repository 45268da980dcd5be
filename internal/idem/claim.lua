-- Under the token's lock: binds the token to the request with fingerprint
-- ARGV[1], unless the record KEYS[1] already decides the answer.
-- Returns {} when the token is gone (expired, or never issued; HSET would
-- recreate it without a TTL), the whole record (HGETALL) when it holds a
-- stored response or another request's fingerprint, and {'claimed', '1'}
-- when this request may run.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {}
end
local status = redis.call('HGET', KEYS[1], 'status')
local fp = redis.call('HGET', KEYS[1], 'fp')
if status or (fp and fp ~= ARGV[1]) then
  return redis.call('HGETALL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'fp', ARGV[1])
return {'claimed', '1'}
