-- KEYS: stock, marker
-- ARGV: itemId, units, markerTtlSeconds
-- Adds units to the item's stock once per marker (a stock addition's id on
-- this shard). An item without a stock record (Redis lost it) gets nothing
-- and no marker: the rebuild counts from the database's quantity less the
-- additions still pending, which are then retried onto the rebuilt record.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 2
end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[3])
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
return 1
