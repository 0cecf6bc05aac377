-- Undoes a claim whose order could not be published (Kafka refused it):
-- the reservation is the user's hold again, until the end of the same
-- window, so the holder may try again within it. Only the claim of this
-- very order is undone, and only while no hold of the user exists.
-- KEYS[1] buyers HASH, KEYS[2] pending ZSET, KEYS[3] holds ZSET
-- ARGV[1] userId, ARGV[2] orderId, ARGV[3] untilMs
-- returns 1 held again, 0 nothing to undo.
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  return 0
end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur or string.sub(cur, -2) == '|c' then
  return 0
end
local a = string.find(cur, '|', 1, true)
local b = string.find(cur, '|', a + 1, true)
if string.sub(cur, 1, a - 1) ~= ARGV[2] then
  return 0
end
local item = string.sub(cur, a + 1, b - 1)
local c = string.find(cur, '|', b + 1, true)
local rest = ''
if c then
  rest = string.sub(cur, c)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. item .. '|' .. ARGV[3] .. rest)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2] .. '|' .. ARGV[1] .. '|' .. item)
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
return 1
