-- The lock strategy's membership write, fenced: a holder whose lease ran
-- out (its token is not above the last one that wrote this set) is refused.
-- KEYS[1] the entity's liker set, KEYS[2] the entity's fence (same slot)
-- ARGV[1] user id, ARGV[2] "add" or "rem", ARGV[3] fencing token, 0 = unfenced
-- Returns SADD's or SREM's reply, or -1 when the token is stale.
local fence = tonumber(ARGV[3])
if fence > 0 then
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  -- <= and not <: one grant writes a set once, so a replay is refused too.
  if fence <= last then
    return -1
  end
  redis.call('SET', KEYS[2], ARGV[3])
end
if ARGV[2] == 'add' then
  return redis.call('SADD', KEYS[1], ARGV[1])
end
return redis.call('SREM', KEYS[1], ARGV[1])
