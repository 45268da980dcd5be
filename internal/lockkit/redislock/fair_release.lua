-- Frees a fair lease: KEYS[1] if owner ARGV[1] holds it, marked by a
-- waiter or not (acquire.lua). It names the live head of the fair queue
-- (KEYS[2] list, KEYS[3] deadlines) on KEYS[1]..':released', so that only
-- the fair waiter whose turn it is wakes. The plain waiters that marked
-- the lease are not woken by that message: their mark is kept in KEYS[4],
-- as long as the queue lives, for the head's grant to take on
-- (fair_acquire.lua), and so reaches the release that frees the key for
-- them. With nobody queued, a mark gets the empty message, which wakes
-- every waiter.
-- Returns the message if freed (sent or not, a string), 0 if not ours.
local held = redis.call('GET', KEYS[1])
if held ~= ARGV[1] and held ~= ARGV[1] .. '!' then
  return 0
end
redis.call('DEL', KEYS[1])
local channel = KEYS[1] .. ':released'
local head = redis.call('LINDEX', KEYS[2], 0)
if head then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while head do
    local deadline = redis.call('ZSCORE', KEYS[3], head)
    if deadline and tonumber(deadline) > now then break end
    redis.call('LPOP', KEYS[2])
    redis.call('ZREM', KEYS[3], head)
    head = redis.call('LINDEX', KEYS[2], 0)
  end
end
local marked = held ~= ARGV[1]
if head then
  if marked then
    redis.call('SET', KEYS[4], '1', 'PX', math.max(redis.call('PTTL', KEYS[2]), 1))
  end
  redis.call('PUBLISH', channel, head)
  return head
end
if redis.call('DEL', KEYS[4]) == 1 or marked then
  redis.call('PUBLISH', channel, '')
end
return ''
