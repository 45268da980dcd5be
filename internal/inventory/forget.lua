-- Drops the stock mirror KEYS[1] after a change of the product committed,
-- and counts the drop in KEYS[2], so that a load that read the database
-- before the change cannot write its stock (load.lua).
redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
return 1
