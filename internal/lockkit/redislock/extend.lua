-- Sets KEYS[1]'s remaining lease to ARGV[2] ms if owner ARGV[1] holds it,
-- marked by a waiter or not (wait.lua).
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. '!' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
