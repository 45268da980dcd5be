-- The end of the scripts that may grant to a waiter elsewhere (next.lua),
-- after fence.lua: the grant goes out on the waiter's Locker's channel as
-- "<owner> <token>", and the waiter after it, if any, is told that it is
-- next ("?<owner>"). The caller is refused, as it would be for a held key:
-- handoff.lua's 1, or wait.lua's {the claim window, the token drawn, the
-- server's TIME}.
-- Otherwise the grant is the caller's Locker's: {owner, token}.
if told then
  if type(token) == 'number' then
    token = string.format('%.0f', token)
  end
  redis.call('PUBLISH', 'redislock:' .. told, grantee .. ' ' .. token)
  if second then
    redis.call('PUBLISH', 'redislock:' .. string.match(second, '^[^:]+'), '?' .. second)
  end
  return refused or {tonumber(window), token, t[1], t[2]}
end
return {grantee, token}
