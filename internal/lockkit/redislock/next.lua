-- Part of the scripts that find KEYS[1] free with waiters queued (wait.lua,
-- handoff.lua): unless `grantee` is set already, it grants the key to the
-- queue's first live waiter (deadline after `ms`), dropping dead ones.
-- A waiting owner is "<Locker id>:<sequence>:<claim window ms>:<lease
-- ms>". A waiter of the caller's own Locker (the owner ARGV[1]'s first
-- field) is granted for its lease: the caller's process hands it over
-- when the reply comes, so one round trip hands the key on. A waiter
-- elsewhere is granted for its claim window and told on its Locker's
-- channel, with its token (tell.lua): it holds the key from the message
-- on, and its claim (an extend to its lease) follows in the background.
-- One that does not claim in time (it died, or gave up and its leave has
-- yet to come) holds the key for no longer than that: the waiter after it
-- is told it is next and looks once the window has passed. With waiters
-- left behind, the new value carries the mark, so that its release hands
-- on in turn.
local told, window, second
if not grantee then
  local head, place, ttl = redis.call('LPOP', KEYS[3])
  while head do
    local deadline = redis.call('ZSCORE', KEYS[4], head)
    redis.call('ZREM', KEYS[4], head)
    place, window, ttl = string.match(head, '^([^:]+):[^:]*:(%d+):(%d+)$')
    if place and deadline and tonumber(deadline) > ms then
      break
    end
    head = redis.call('LPOP', KEYS[3])
  end
  if not head then
    return refused or {0, redis.call('GET', KEYS[2]) or '0', t[1], t[2]}
  end
  second = redis.call('LINDEX', KEYS[3], 0)
  local mark = ''
  if second then
    mark = '!'
  end
  if place == string.match(ARGV[1], '^[^:]+') then
    redis.call('SET', KEYS[1], head .. mark, 'PX', ttl)
  else
    redis.call('SET', KEYS[1], head .. mark, 'PX', window)
    told = place
  end
  grantee = head
end
