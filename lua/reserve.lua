-- KEYS[1] stock HASH, KEYS[2] buyers HASH, KEYS[3] pending ZSET,
-- KEYS[4] reserved counter (every reservation ever made),
-- KEYS[5] (a hold only) holds ZSET
-- ARGV[1] itemId, ARGV[2] userId, ARGV[3] orderId, ARGV[4] nowMs (a hold:
-- the end of its claim window)
local prev = redis.call('HGET', KEYS[2], ARGV[2])
if prev then
  local sep = string.find(prev, '|', 1, true)
  return {1, string.sub(prev, 1, sep - 1)}
end
local left = redis.call('HGET', KEYS[1], ARGV[1])
if not left then
  return {3, ''}
end
if tonumber(left) <= 0 then
  return {2, ''}
end
redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3] .. '|' .. ARGV[1] .. '|' .. ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3] .. '|' .. ARGV[2] .. '|' .. ARGV[1])
redis.call('INCR', KEYS[4])
if KEYS[5] then
  redis.call('ZADD', KEYS[5], ARGV[4], ARGV[2])
end
return {0, ARGV[3]}
