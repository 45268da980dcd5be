-- Keeps a running request's lease alive.
-- KEYS[1] the record, KEYS[2] its lease; ARGV[1] the run, ARGV[2] lease TTL (ms)
-- Returns 1, or 0 when a later run has claimed the record (or it expired):
-- the lease is lost. A lease that lapsed while nobody took over is taken
-- again: the record still names this run.
if redis.call('HGET', KEYS[1], 'run') ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
