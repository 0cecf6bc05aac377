-- KEYS[1] stock HASH, KEYS[2] buyers HASH, KEYS[3] pending ZSET
-- ARGV[1] userId, ARGV[2] orderId, ARGV[3] itemId
redis.call('ZREM', KEYS[3], ARGV[2] .. '|' .. ARGV[1] .. '|' .. ARGV[3])
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if not cur then
  return 0
end
local sep = string.find(cur, '|', 1, true)
if string.sub(cur, 1, sep - 1) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[1], ARGV[3], 1)
return 1
