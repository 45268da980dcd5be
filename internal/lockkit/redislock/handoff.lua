-- Frees lock KEYS[1] if owner ARGV[1] holds it, the release of a lease
-- that others may wait for: one granted from the queue, or one whose
-- release.lua found the mark. An unmarked value (nobody queued) is
-- deleted. A marked one (a trailing '!', wait.lua) goes to the first live
-- waiter of the queue KEYS[3] (deadlines KEYS[4]) in the same step
-- (next.lua), with its token from KEYS[2] if it is a waiter of the
-- releaser's own Locker. ARGV: owner, and '1' if the owner also leaves
-- the queue (a waiter that gives up: a grant made to it meanwhile is
-- handed on at once, not left to its claim window).
-- Replies 0 if not ours, 1 if freed or granted elsewhere, {owner, token}
-- if granted to a waiter of the releaser's Locker.
if ARGV[2] == '1' then
  redis.call('LREM', KEYS[3], 0, ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
end
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
if held ~= ARGV[1] .. '!' then
  return 0
end
redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grantee, refused = nil, 1
