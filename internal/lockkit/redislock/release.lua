-- Frees KEYS[1] if owner ARGV[1] still holds it and, if anyone waits for
-- it, tells them on KEYS[1]..':released'. Plain waiters say they wait by
-- setting KEYS[2] when refused (wanted.lua): a plain lease's release
-- deletes the mark with the lock, so that an uncontended release is a GET
-- and a DEL, and publishes an empty message if it found one, which wakes
-- every process's first plain waiter and its fair waiters, who try (the
-- fair queue still decides). A fair lease passes its queue (KEYS[3] list,
-- KEYS[4] deadlines) and names the queue's live head, so that only the
-- fair waiter whose turn it is wakes; the mark then stays, for the plain
-- waiters that message did not wake, until a release wakes them.
-- Returns the message if freed (sent or not), 0 if not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if not KEYS[3] then
  if redis.call('DEL', KEYS[1], KEYS[2]) == 2 then
    redis.call('PUBLISH', KEYS[1] .. ':released', '')
  end
  return ''
end
local channel = KEYS[1] .. ':released'
redis.call('DEL', KEYS[1])
local head = redis.call('LINDEX', KEYS[3], 0)
if head then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while head do
    local deadline = redis.call('ZSCORE', KEYS[4], head)
    if deadline and tonumber(deadline) > now then break end
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], head)
    head = redis.call('LINDEX', KEYS[3], 0)
  end
end
if head then
  redis.call('PUBLISH', channel, head)
  return head
end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PUBLISH', channel, '')
end
return ''
