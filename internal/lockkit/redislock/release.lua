-- Frees a lease granted on arrival (acquire.lua): KEYS[1] if owner ARGV[1]
-- holds it and nobody marked it. An uncontended release is so a GET and a
-- DEL of one key, and sends nothing. A value a waiter marked (a trailing
-- '!', wait.lua) is left alone: the caller hands it on (handoff.lua),
-- which takes the queue's keys.
-- Replies 1 if freed, -1 if marked, 0 if not ours.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
if held == ARGV[1] .. '!' then
  return -1
end
return 0
