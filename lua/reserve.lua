-- KEYS[1] stock HASH, KEYS[2] buyers HASH, KEYS[3] pending ZSET,
-- KEYS[4] reserved counter (every reservation ever made),
-- KEYS[5] a hold: holds ZSET; a purchase under a placement lease: owners
-- HASH (lease.lua)
-- ARGV[1] itemId, ARGV[2] userId, ARGV[3] orderId, ARGV[4] nowMs (a hold:
-- the end of its claim window), ARGV[5] (a purchase under a lease) its
-- slot
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
if ARGV[5] then
  redis.call('HSET', KEYS[5], ARGV[3], ARGV[5] .. '|' .. ARGV[2] .. '|' .. ARGV[1] .. '|' .. ARGV[4])
elseif KEYS[5] then
  redis.call('ZADD', KEYS[5], ARGV[4], ARGV[2])
end
return {0, ARGV[3]}
