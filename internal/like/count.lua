-- The lock strategy's counter move, once per change however often it is
-- sent: a client that lost the reply (a dropped connection, a failover)
-- sends it again, and INCRBY alone would count the like twice.
-- KEYS[1] the owner's received counter, KEYS[2] the change's marker (the
-- counter's slot: its hash tag is the counter's name)
-- ARGV[1] the move (1 or -1), ARGV[2] the marker's lifetime in ms
-- Returns the counter after the move.
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then
  return redis.call('INCRBY', KEYS[1], ARGV[1])
end
return tonumber(redis.call('GET', KEYS[1]) or '0')
