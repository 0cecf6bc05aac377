-- Ends a hold whose claim window is over (or every hold, when the sale
-- ends): the hold's reservation is given back as release.lua and
-- shard_release.lua give one back, in the same call that removes the hold,
-- so a claim (hold_claim.lua) and a lapse never both win.
-- KEYS[1] stock HASH, KEYS[2] buyers HASH, KEYS[3] pending ZSET,
-- KEYS[4] returning HASH, KEYS[5] holds ZSET
-- ARGV[1] userId, ARGV[2] nowMs
-- returns {0} no hold, {5} not due yet, {1, orderId, itemId} the unit is
-- back on this shard, {2, orderId, itemId, donor} the unit is owed to its
-- donor shard (the caller gives it back, as after shard_release.lua).
local untilMs = redis.call('ZSCORE', KEYS[5], ARGV[1])
if not untilMs then
  return {0}
end
if tonumber(untilMs) > tonumber(ARGV[2]) then
  return {5}
end
redis.call('ZREM', KEYS[5], ARGV[1])
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if not cur or string.sub(cur, -2) == '|c' then
  return {0}
end
local a = string.find(cur, '|', 1, true)
local b = string.find(cur, '|', a + 1, true)
local order = string.sub(cur, 1, a - 1)
local item = string.sub(cur, a + 1, b - 1)
redis.call('ZREM', KEYS[3], order .. '|' .. ARGV[1] .. '|' .. item)
redis.call('HDEL', KEYS[2], ARGV[1])
local c = string.find(cur, '|', b + 1, true)
if not c then
  redis.call('HINCRBY', KEYS[1], item, 1)
  return {1, order, item}
end
local donor = string.sub(cur, c + 1)
redis.call('HSET', KEYS[4], order, donor .. '|' .. item)
return {2, order, item, donor}
