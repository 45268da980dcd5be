-- Frees a plain lease: KEYS[1] if owner ARGV[1] holds it. A lease that a
-- waiter marked (a trailing '!', acquire.lua) is freed too, and the
-- waiters are told with an empty message on KEYS[1]..':released', which
-- wakes every process's first plain waiter and its fair waiters, who try
-- (the fair queue still decides). An uncontended release is so a GET and
-- a DEL of one key, and sends nothing.
-- Returns 1 if freed, 0 if not ours.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
if held ~= ARGV[1] .. '!' then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1] .. ':released', '')
return 1
