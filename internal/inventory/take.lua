-- Take ARGV[1] units from the stock mirror KEYS[1], all or nothing.
-- KEYS[2] counts the mirror's drops (forget.lua).
-- KEYS[3] marks this take once it took (same slot, ARGV[2] ms): a client
-- that lost the reply sends the script again, and DECRBY must not run twice.
-- Returns {1, left, drops} when taken, {0, left} when fewer than asked are
-- left, {-1, 0} when the mirror is not loaded (the caller loads it and
-- retries). drops names the mirror the units came from, for a give-back.
local done = redis.call('GET', KEYS[3])
if done then
  local left, drops = string.match(done, '^(-?%d+) (%d+)$')
  return {1, tonumber(left), tonumber(drops)}
end
local stock = redis.call('GET', KEYS[1])
if not stock then
  return {-1, 0}
end
stock = tonumber(stock)
local want = tonumber(ARGV[1])
if stock < want then
  return {0, stock}
end
local left = redis.call('DECRBY', KEYS[1], want)
local drops = tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('SET', KEYS[3], left .. ' ' .. drops, 'PX', ARGV[2])
return {1, left, drops}
