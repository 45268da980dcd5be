-- Frees KEYS[1] if owner ARGV[1] still holds it and, if anyone waits for
-- it, tells them on KEYS[1]..':released'. Plain waiters say they wait by
-- setting KEYS[2] when refused (wanted.lua), which this deletes with the
-- lock: an uncontended release is a GET and a DEL. A fair lease passes
-- its queue (KEYS[3] list, KEYS[4] deadlines) and names its live head, so
-- that only the fair waiter whose turn it is wakes. An empty message
-- (nobody queued, or a plain lease, which spares the queue lookup) wakes
-- every process's first plain waiter and its fair waiters, who try, and
-- the queue still decides.
-- Returns the message if freed (sent or not), 0 if not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local wanted = redis.call('DEL', KEYS[1], KEYS[2]) == 2
local head = false
if KEYS[3] then
  head = redis.call('LINDEX', KEYS[3], 0)
end
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
if head or wanted then
  redis.call('PUBLISH', KEYS[1] .. ':released', head or '')
end
return head or ''
