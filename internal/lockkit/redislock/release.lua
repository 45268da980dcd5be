-- Frees KEYS[1] if owner ARGV[1] still holds it, and tells the waiters on
-- channel ARGV[2]. A fair lease (ARGV[3] = '1') names the live head of the
-- fair queue (KEYS[2] list, KEYS[3] deadlines), so that only the fair
-- waiter whose turn it is wakes. An empty message (nobody queued, or a
-- plain lease, which spares the queue lookup) wakes every process's first
-- plain waiter and its fair waiters, who try, and the queue still decides.
-- Returns the message if freed, 0 if not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local head = false
if ARGV[3] == '1' then
  head = redis.call('LINDEX', KEYS[2], 0)
end
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
head = head or ''
redis.call('PUBLISH', ARGV[2], head)
return head
