-- The end of every script that grants: it issues the grant's fencing token
-- from the counter KEYS[2] into `token`, which the script then replies
-- with. Written out here rather than as a function the scripts call, which
-- Lua would create anew on every call.
--
-- The token is above the key's last token and at least the server's clock
-- in microseconds. The clock is what keeps tokens rising when the counter
-- goes back (a restart without persistence, a failover to a replica that
-- missed the last increments, eviction): a later grant still gets a
-- higher token as long as the server's clock has not stepped back by more
-- than the time between the two grants. Lua numbers are doubles, exact to
-- 2^53; microseconds since 1970 are about 2^51 (and reach 2^53 in the
-- year 2255). redis.call writes a number with every digit (%.17g; the
-- shortest exact form since Redis 7.2), where tostring would round to 14,
-- and a script's number reply is an integer.
--
-- The token may be the string of its digits (the clock's, as read): the
-- client reads it as the integer it spells, and the server is spared a
-- tonumber of 16 digits, which takes libc's slow path.
local t = redis.call('TIME')
-- The clock's own digits (seconds, then microseconds padded to 6): a
-- number argument would be formatted with %.17g, a cost a string has not.
local micros = t[2]
if #micros < 6 then
  micros = string.sub('00000' .. micros, -6)
end
local token = t[1] .. micros
-- One write when the clock is ahead of the counter, as it nearly always is.
local last = redis.call('SET', KEYS[2], token, 'GET')
-- Both are decimals without leading zeros: the longer is the larger, and
-- at equal length their string order is their numeric order.
if last and (#last > #token or (#last == #token and last >= token)) then
  token = tonumber(last) + 1
  redis.call('SET', KEYS[2], token)
end
