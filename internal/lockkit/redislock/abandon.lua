-- A waiter that gives up leaves the fair queue, and frees the key if its
-- last attempt was granted although the reply never reached it (a timeout
-- or a cancelled context mid-flight). KEYS: lock, queue, deadlines.
-- ARGV: owner, channel.
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. '!' then
  redis.call('DEL', KEYS[1])
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('LINDEX', KEYS[2], 0)
  redis.call('PUBLISH', ARGV[2], head or '')
end
return 1
