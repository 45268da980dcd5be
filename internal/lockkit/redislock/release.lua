-- Frees KEYS[1] if owner ARGV[1] still holds it, and tells the waiters on
-- channel ARGV[2]. A fair lease (ARGV[3] = '1') names the live head of the
-- fair queue (KEYS[2] list, KEYS[3] deadlines) so that only the waiter
-- whose turn it is wakes; any other release sends an empty message, which
-- wakes every process's first waiter (fair ones among them try, and the
-- queue still decides). Returns 1 if freed, 0 if not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local head = false
if ARGV[3] == '1' then
  head = redis.call('LINDEX', KEYS[2], 0)
  local now = 0
  if head then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  while head do
    local deadline = redis.call('ZSCORE', KEYS[3], head)
    if deadline and tonumber(deadline) > now then break end
    redis.call('LPOP', KEYS[2])
    redis.call('ZREM', KEYS[3], head)
    head = redis.call('LINDEX', KEYS[2], 0)
  end
end
redis.call('PUBLISH', ARGV[2], head or '')
return 1
