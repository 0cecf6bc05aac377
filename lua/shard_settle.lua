-- Turns a claim into a reservation whose unit is on loan from a donor
-- shard, on the home shard. It settles only the claim of this very order:
-- a claim abandoned meanwhile (swept, dropped) is never revived, so the
-- caller gives the loan back.
-- KEYS[1] buyers HASH, KEYS[2] pending ZSET, KEYS[3] reserved counter,
-- KEYS[4] claims ZSET, KEYS[5] (a hold only) holds ZSET
-- ARGV[1] userId, ARGV[2] orderId, ARGV[3] itemId, ARGV[4] claim's nowMs,
-- ARGV[5] donor shard
-- returns 0 settled, 1 no such claim.
local claim = ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4] .. '|c'
if redis.call('HGET', KEYS[1], ARGV[1]) ~= claim then
  return 1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4] .. '|' .. ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2] .. '|' .. ARGV[1] .. '|' .. ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[2] .. '|' .. ARGV[1] .. '|' .. ARGV[3])
redis.call('INCR', KEYS[3])
if KEYS[5] then
  redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1])
end
return 0
