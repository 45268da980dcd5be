-- Decides what a request with an Idempotency-Key does, in one step.
-- KEYS[1] the key's record (a hash: issued, fp, run, claim, status, header,
-- body, rid)
-- KEYS[2] the in-flight lease of the record (value: the run holding it)
-- ARGV[1] the request's fingerprint, ARGV[2] lease TTL (ms),
-- ARGV[3] record TTL (ms), ARGV[4] '1' if the key must be a minted token,
-- ARGV[5] this claim's id: a client that lost the reply sends the script
-- again, and the resend must find its own claim, not a run in flight
-- Returns {'unknown'}, {'in-use'}, {'claimed', run}, or
-- {'record', fp, status, header, body, rid} when the record decides.
-- The run number fences the record: only the run that claimed it last may
-- store a response or free it, whatever happened to its lease meanwhile.
local rec, lease = KEYS[1], KEYS[2]
if redis.call('EXISTS', rec) == 0 then
  if ARGV[4] == '1' then
    return {'unknown'}
  end
  -- The record reached its TTL under a run that still holds the lease:
  -- the key is that run's until it ends.
  if redis.call('EXISTS', lease) == 1 then
    return {'in-use'}
  end
  -- A client-chosen key, first seen: it lives as long as a minted token.
  redis.call('HSET', rec, 'fp', ARGV[1], 'run', 1, 'claim', ARGV[5])
  redis.call('PEXPIRE', rec, ARGV[3])
  redis.call('SET', lease, '1', 'PX', ARGV[2])
  return {'claimed', '1'}
end
if ARGV[4] == '1' and redis.call('HEXISTS', rec, 'issued') == 0 then
  return {'unknown'}
end
local f = redis.call('HMGET', rec, 'fp', 'status', 'header', 'body', 'rid')
if f[2] or (f[1] and f[1] ~= ARGV[1]) then
  return {'record', f[1] or '', f[2] or '', f[3] or '', f[4] or '', f[5] or ''}
end
if redis.call('EXISTS', lease) == 1 then
  if redis.call('HGET', rec, 'claim') == ARGV[5] then
    return {'claimed', redis.call('HGET', rec, 'run')}
  end
  return {'in-use'}
end
-- Free, or its last run crashed (the lease expired): this request runs.
local run = tostring(redis.call('HINCRBY', rec, 'run', 1))
redis.call('HSET', rec, 'fp', ARGV[1], 'claim', ARGV[5])
redis.call('SET', lease, run, 'PX', ARGV[2])
return {'claimed', run}
