-- The lock strategy's membership check, which claims the set for the
-- checking holder's token before it reads: from then on, only that token
-- may write the set (write.lua). A holder whose lease ran out, and who
-- checked earlier, can then no longer write between this check and the
-- write that follows it.
-- KEYS[1] the entity's liker set, KEYS[2] the entity's fence (same slot)
-- ARGV[1] user id, ARGV[2] fencing token, 0 = unfenced
-- Returns 1 if the user is in the set, 0 if not, -1 when the token is stale.
local token = tonumber(ARGV[2])
if token > 0 then
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  -- < and not <=: a holder may check again under the same token.
  if token < last then
    return -1
  end
  if token > last then
    redis.call('SET', KEYS[2], ARGV[2])
  end
end
return redis.call('SISMEMBER', KEYS[1], ARGV[1])
