-- First-come first-served grant of KEYS[1] (fence KEYS[2]) through a queue
-- of waiters: KEYS[3] is the list in arrival order, KEYS[4] a sorted set of
-- each waiter's deadline; KEYS[5] asks a held key's release for a message
-- (wanted.lua). A waiter keeps its place by calling again before its
-- deadline; a dead one is dropped when it reaches the head, so it holds the
-- queue up for at most one waiter timeout.
-- ARGV: owner, ttl ms, waiter timeout ms (0: do not queue, just try).
-- Returns the fence on a grant, and otherwise -1 - the ms to wait at most
-- (fence.lua): the holder's remaining lease, or, when the key is free but
-- another waiter's turn, the time that waiter has left to take it.
local owner, ttl, timeout = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local head = redis.call('LINDEX', KEYS[3], 0)
local head_deadline = 0
while head do
  local deadline = tonumber(redis.call('ZSCORE', KEYS[4], head) or '0')
  if deadline > now then
    head_deadline = deadline
    break
  end
  redis.call('LPOP', KEYS[3])
  redis.call('ZREM', KEYS[4], head)
  head = redis.call('LINDEX', KEYS[3], 0)
end

local free = redis.call('EXISTS', KEYS[1]) == 0
if free and (not head or head == owner) then
  redis.call('SET', KEYS[1], owner, 'PX', ttl)
  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], owner)
  end
  return next_fence(KEYS[2])
end

if timeout > 0 then
  if not redis.call('ZSCORE', KEYS[4], owner) then
    redis.call('RPUSH', KEYS[3], owner)
  end
  redis.call('ZADD', KEYS[4], now + timeout, owner)
  -- The queue disappears by itself once every waiter has gone silent.
  redis.call('PEXPIRE', KEYS[3], 2 * timeout)
  redis.call('PEXPIRE', KEYS[4], 2 * timeout)
end
if free then
  return -1 - (head_deadline - now)
end
local wanted = false
if timeout > 0 then wanted = KEYS[5] end
return -1 - refused(KEYS[1], wanted)
