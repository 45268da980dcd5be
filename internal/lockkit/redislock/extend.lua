-- Sets KEYS[1]'s remaining lease to ARGV[2] ms if owner ARGV[1] holds it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
