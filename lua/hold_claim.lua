-- A holder's purchase: turns the user's hold (a reservation made for them
-- at their turn, see reserve.lua's holds key) into a reservation bought
-- now, if its claim window has not ended. It runs on the user's home
-- shard, where the buyer record, pending member and hold are; the unit is
-- already taken, so a claim never meets SOLD_OUT.
-- KEYS[1] buyers HASH, KEYS[2] pending ZSET, KEYS[3] holds ZSET,
-- KEYS[4] (under a placement lease) owners HASH
-- ARGV[1] userId, ARGV[2] itemId, ARGV[3] nowMs, ARGV[4] (under a lease)
-- the lease's slot
-- returns {0, orderId, untilMs} claimed, {1, orderId} bought before (no hold left),
-- {6, ''} no hold, {7, orderId} the window ended (the lapse gives the
-- unit back), {8, heldItemId} the hold is of another item.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur or string.sub(cur, -2) == '|c' then
  return {6, ''}
end
local a = string.find(cur, '|', 1, true)
local b = string.find(cur, '|', a + 1, true)
local order = string.sub(cur, 1, a - 1)
local untilMs = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not untilMs then
  return {1, order}
end
if tonumber(ARGV[3]) > tonumber(untilMs) then
  return {7, order}
end
local item = string.sub(cur, a + 1, b - 1)
if item ~= ARGV[2] then
  return {8, item}
end
local c = string.find(cur, '|', b + 1, true)
local rest = ''
if c then
  rest = string.sub(cur, c)
end
redis.call('HSET', KEYS[1], ARGV[1], order .. '|' .. item .. '|' .. ARGV[3] .. rest)
redis.call('ZADD', KEYS[2], ARGV[3], order .. '|' .. ARGV[1] .. '|' .. item)
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[4] then
  redis.call('HSET', KEYS[4], order, ARGV[4] .. '|' .. ARGV[1] .. '|' .. item .. '|' .. ARGV[3])
end
return {0, order, untilMs}
