-- Extends one shard's holds by the time the sale was paused, so that a
-- holder loses no claim time to an operator's pause. A hold whose window
-- overlaps the pause [pausedAt, resumedAt) ends later by the overlap: its
-- holds score, and the time of its buyer record and pending member (which
-- the reconciler reads), move together. Each pause is applied once per
-- shard: the marker keeps the pause start of the last one applied, so a
-- leader that takes over halfway through changes nothing twice.
-- KEYS[1] holds ZSET, KEYS[2] buyers HASH, KEYS[3] pending ZSET,
-- KEYS[4] marker STRING
-- ARGV[1] pausedAtMs, ARGV[2] resumedAtMs, ARGV[3] windowMs
-- returns the number of holds extended (0 when this pause was applied
-- here before).
if redis.call('GET', KEYS[4]) == ARGV[1] then
  return 0
end
local paused, resumed, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n = 0
local hs = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES')
for i = 1, #hs, 2 do
  local uid, untilMs = hs[i], tonumber(hs[i + 1])
  local d = resumed - math.max(paused, untilMs - window)
  if d > 0 then
    local newUntil = string.format('%d', untilMs + d)
    redis.call('ZADD', KEYS[1], newUntil, uid)
    local cur = redis.call('HGET', KEYS[2], uid)
    if cur and string.sub(cur, -2) ~= '|c' then
      local a = string.find(cur, '|', 1, true)
      local b = string.find(cur, '|', a + 1, true)
      local order = string.sub(cur, 1, a - 1)
      local item = string.sub(cur, a + 1, b - 1)
      local c = string.find(cur, '|', b + 1, true)
      local rest = ''
      if c then
        rest = string.sub(cur, c)
      end
      redis.call('HSET', KEYS[2], uid, order .. '|' .. item .. '|' .. newUntil .. rest)
      redis.call('ZADD', KEYS[3], 'XX', newUntil, order .. '|' .. uid .. '|' .. item)
    end
    n = n + 1
  end
end
redis.call('SET', KEYS[4], ARGV[1])
return n
