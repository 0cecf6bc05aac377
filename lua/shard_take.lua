-- Takes one unit on a donor shard for a claim of another shard, and
-- records it as a loan to that order (the loan is what gives the unit
-- back, once: shard_give.lua).
-- KEYS[1] stock HASH, KEYS[2] loans HASH
-- ARGV[1] itemId, ARGV[2] orderId, ARGV[3] userId, ARGV[4] nowMs
-- returns 0 taken, 2 no stock on this shard, 3 no stock record.
local left = redis.call('HGET', KEYS[1], ARGV[1])
if not left then
  return 3
end
if tonumber(left) <= 0 then
  return 2
end
redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3] .. '|' .. ARGV[1] .. '|' .. ARGV[4])
return 0
