-- The release of a sale whose stock is split over shards, run on the
-- user's home shard. A unit of the home shard goes back as in
-- release.lua; a unit on loan is owed to its donor: the buyer record moves
-- to the returning HASH, which the caller (or the reconciler, after a
-- crash) clears once the donor took the unit back (shard_give.lua).
-- KEYS[1] stock HASH, KEYS[2] buyers HASH, KEYS[3] pending ZSET,
-- KEYS[4] returning HASH
-- ARGV[1] userId, ARGV[2] orderId, ARGV[3] itemId
-- returns {1, ''} back on this shard, {0, ''} given back before,
-- {2, donor} owed to the donor shard, {4, ''} a claim still in flight.
redis.call('ZREM', KEYS[3], ARGV[2] .. '|' .. ARGV[1] .. '|' .. ARGV[3])
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if cur then
  local sep = string.find(cur, '|', 1, true)
  if string.sub(cur, 1, sep - 1) == ARGV[2] then
    local a = string.find(cur, '|', sep + 1, true)
    local b = string.find(cur, '|', a + 1, true)
    if not b then
      redis.call('HDEL', KEYS[2], ARGV[1])
      redis.call('HINCRBY', KEYS[1], ARGV[3], 1)
      return {1, ''}
    end
    local donor = string.sub(cur, b + 1)
    if donor == 'c' then
      return {4, ''}
    end
    redis.call('HDEL', KEYS[2], ARGV[1])
    redis.call('HSET', KEYS[4], ARGV[2], donor .. '|' .. string.sub(cur, sep + 1, a - 1))
    return {2, donor}
  end
end
local owed = redis.call('HGET', KEYS[4], ARGV[2])
if owed then
  local sep = string.find(owed, '|', 1, true)
  return {2, string.sub(owed, 1, sep - 1)}
end
return {0, ''}
