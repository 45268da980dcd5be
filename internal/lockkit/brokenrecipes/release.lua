-- Owner-checked delete: SetNXExpire's one safe part, so that its test shows
-- the two-step acquire failing and nothing else.
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
