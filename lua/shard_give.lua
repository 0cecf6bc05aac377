-- Gives a loaned unit back to its donor shard, once: only the call that
-- removes the loan puts the unit back.
-- KEYS[1] stock HASH, KEYS[2] loans HASH
-- ARGV[1] orderId, ARGV[2] itemId
-- returns 1 when the unit went back, 0 when there was no such loan.
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
return 1
