-- The hash-tag strategy: the liker set and the owner's counter share the
-- slot {owner:<id>}, so one script checks, writes and counts atomically and
-- needs no lock. The counter follows the set's own reply, so liking twice
-- or unliking twice changes nothing.
-- KEYS[1] the entity's liker set, KEYS[2] the owner's received counter
-- ARGV[1] user id, ARGV[2] "add" or "rem"
-- Returns 1 when the membership changed, 0 when it already was so.
if ARGV[2] == 'add' then
  if redis.call('SADD', KEYS[1], ARGV[1]) == 1 then
    redis.call('INCR', KEYS[2])
    return 1
  end
  return 0
end
if redis.call('SREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('DECR', KEYS[2])
  return 1
end
return 0
