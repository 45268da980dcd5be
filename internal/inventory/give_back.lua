-- Returns ARGV[1] units to the stock mirror KEYS[1], only into the mirror
-- they came from: KEYS[2] counts its drops, ARGV[2] is the count when they
-- were taken. INCRBY on a missing key would create a mirror holding just
-- these units, and a mirror loaded after a drop never counted them.
-- KEYS[3] marks this give-back once it ran (same slot, ARGV[3] ms): a
-- client that lost the reply sends it again, and INCRBY must not run twice.
-- Returns the mirror's stock after, or 0 when it gave nothing back.
if redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[3]) == false then
  return tonumber(redis.call('GET', KEYS[1]) or '0')
end
if redis.call('EXISTS', KEYS[1]) == 1 and (redis.call('GET', KEYS[2]) or '0') == ARGV[2] then
  return redis.call('INCRBY', KEYS[1], ARGV[1])
end
return 0
