-- Take ARGV[1] units from the stock mirror KEYS[1], all or nothing.
-- KEYS[2] counts the mirror's drops (forget.lua).
-- Returns {1, left, drops} when taken, {0, left} when fewer than asked are
-- left, {-1, 0} when the mirror is not loaded (the caller loads it and
-- retries). drops names the mirror the units came from, for a give-back.
local stock = redis.call('GET', KEYS[1])
if not stock then
  return {-1, 0}
end
stock = tonumber(stock)
local want = tonumber(ARGV[1])
if stock < want then
  return {0, stock}
end
return {1, redis.call('DECRBY', KEYS[1], want), tonumber(redis.call('GET', KEYS[2]) or '0')}
