-- Keeps a finished request's response on its record, once.
-- KEYS[1] the record, KEYS[2] its lease
-- ARGV[1] the run, ARGV[2] fingerprint, ARGV[3] status, ARGV[4] headers
-- (JSON), ARGV[5] body, ARGV[6] the request id that produced it
-- Returns 1 when stored; 0 when the record expired (HSET would recreate it
-- without a TTL) or a later run claimed it after this one's lease lapsed:
-- the first answer stored stays the answer.
if redis.call('HGET', KEYS[1], 'run') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'status') == 1 then
  return 0
end
-- HSET keeps the key's TTL: the record expires when it was created to.
redis.call('HSET', KEYS[1], 'fp', ARGV[2], 'status', ARGV[3], 'header', ARGV[4], 'body', ARGV[5], 'rid', ARGV[6])
redis.call('DEL', KEYS[2])
return 1
