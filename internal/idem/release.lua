-- Frees a record whose run ended without a response worth keeping (a 503,
-- a malformed request), so that a retry runs again, with any body.
-- KEYS[1] the record, KEYS[2] its lease; ARGV[1] the run
-- A later run that claimed the record meanwhile keeps it.
if redis.call('HGET', KEYS[1], 'run') ~= ARGV[1] then
  return 0
end
if redis.call('HEXISTS', KEYS[1], 'status') == 0 then
  redis.call('HDEL', KEYS[1], 'fp')
end
redis.call('DEL', KEYS[2])
return 1
