-- First-come first-served grant of KEYS[1] (fence KEYS[2]) through a queue
-- of waiters: KEYS[3] is the list in arrival order, KEYS[4] a sorted set of
-- each waiter's deadline; KEYS[5] is the plain waiters' mark a fair
-- release kept for the next fair grant (fair_release.lua). A waiter keeps
-- its place by calling again before its deadline; a dead one is dropped
-- when it reaches the head, so it holds the queue up for at most one
-- waiter timeout.
-- ARGV: owner, ttl ms, waiter timeout ms (0: do not queue, just try).
-- Returns the fence on a grant (fence.lua, which ends this script), and
-- otherwise -1 - the ms to wait at most: the holder's remaining lease, or,
-- when the key is free but another waiter's turn, the time that waiter
-- has left to take it.
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

-- Our own owner's value, marked or not, means this grant ran already and
-- go-redis resent it after its reply was lost: it is answered as a grant
-- again, as acquire.lua answers it: its TTL as set, a fresh token (see
-- there why that is safe). Its first run took it off the queue already.
local held = redis.call('GET', KEYS[1])
if held ~= owner and held ~= owner .. '!' then
  local free = not held
  if not free or (head and head ~= owner) then
    if timeout > 0 then
      if not redis.call('ZSCORE', KEYS[4], owner) then
        redis.call('RPUSH', KEYS[3], owner)
      end
      redis.call('ZADD', KEYS[4], now + timeout, owner)
      -- The queue disappears by itself once every waiter has gone silent.
      redis.call('PEXPIRE', KEYS[3], 2 * timeout)
      redis.call('PEXPIRE', KEYS[4], 2 * timeout)
      -- Held: ask its release for a message, as a plain waiter does
      -- (acquire.lua); a plain holder's release sends none otherwise.
      if not free and string.sub(held, -1) ~= '!' then
        redis.call('APPEND', KEYS[1], '!')
      end
    end
    if free then
      return -1 - (head_deadline - now)
    end
    return -1 - math.max(redis.call('PTTL', KEYS[1]), 0)
  end

  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], owner)
  end
  local mark = ''
  if redis.call('DEL', KEYS[5]) == 1 then
    mark = '!'
  end
  redis.call('SET', KEYS[1], owner .. mark, 'PX', ttl)
end
