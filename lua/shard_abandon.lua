-- Abandons the claim of an order on its home shard (every shard was dry,
-- or the claim outlived any reservation in flight). Once it answers 1 the
-- order can never hold a unit, so any loan to it may go back.
-- KEYS[1] buyers HASH, KEYS[2] claims ZSET
-- ARGV[1] userId, ARGV[2] orderId, ARGV[3] itemId
-- returns 1 abandoned (or no claim of it left), 0 the order holds a unit.
redis.call('ZREM', KEYS[2], ARGV[2] .. '|' .. ARGV[1] .. '|' .. ARGV[3])
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then
  return 1
end
local sep = string.find(cur, '|', 1, true)
if string.sub(cur, 1, sep - 1) ~= ARGV[2] then
  return 1
end
if string.sub(cur, -2) == '|c' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
return 0
