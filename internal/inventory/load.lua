-- Loads the stock mirror KEYS[1] with ARGV[1] units, read from the
-- database, unless the mirror was dropped since: KEYS[2] counts the drops,
-- ARGV[2] is the count the loader saw before it read. A drop follows a
-- change that committed, so a load from a read older than the drop would
-- put back a stock the database no longer holds.
-- Returns 1 when the mirror holds a value (this one, or a faster loader's),
-- 0 when this read is too old to load.
if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return 1
