-- A gateway's placement lease: the slot named in the owners record of each
-- reservation it makes (reserve.lua, hold_claim.lua), so that when the
-- gateway dies or freezes its reservations still in flight can be found
-- and settled at once (reconcile.Reconciler). Times are Redis's TIME, the
-- one clock every gateway reads the same.
-- KEYS[1] leases HASH slot -> token, KEYS[2] renewals ZSET slot scored by
-- the last renewal (ms), KEYS[3] clock STRING: the time of the last op
-- ARGV[1] op, ARGV[2] slot, ARGV[3] token, ARGV[4] ttlMs
--   tick:    only keeps the clock (every flashsale process ticks twice a
--            second, so the clock stops only when Redis does).
--   acquire: takes the slot if nobody holds it (a lapsed slot is held until
--            the reclaim frees it); returns 1 taken, 0 held.
--   renew:   returns 1 renewed, 0 lost: another token holds the slot, or
--            the lease lapsed (the reclaim owns its reservations now; a
--            lapsed lease is never renewed, so the gateway and the reclaim
--            never both act on it).
--   lapsed:  returns {slot, token, ...} of the leases not renewed for ttlMs.
--   free:    drops the slot if token still holds it and it is lapsed;
--            returns 1 freed, 0 not.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]
-- A gap of half a TTL since the last op means Redis ran nothing (frozen,
-- or cut off from every process): the leases' time stops with it, or a
-- frozen Redis would make every gateway's lease lapse at once.
local last = tonumber(redis.call('GET', KEYS[3]))
if last and now - last >= tonumber(ARGV[4]) / 2 then
  local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    redis.call('ZADD', KEYS[2], tonumber(all[i + 1]) + (now - last), all[i])
  end
end
redis.call('SET', KEYS[3], now)
if op == 'tick' then
  return 1
end
if op == 'lapsed' then
  local slots = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - tonumber(ARGV[4])))
  local out = {}
  for _, s in ipairs(slots) do
    local tok = redis.call('HGET', KEYS[1], s)
    if tok then
      out[#out + 1] = s
      out[#out + 1] = tok
    else
      redis.call('ZREM', KEYS[2], s)
    end
  end
  return out
end
local cur = redis.call('HGET', KEYS[1], ARGV[2])
local seen = redis.call('ZSCORE', KEYS[2], ARGV[2])
local lapsed = (not seen) or (now - tonumber(seen) >= tonumber(ARGV[4]))
if op == 'acquire' then
  if cur then
    return 0
  end
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[2], now, ARGV[2])
  return 1
elseif op == 'renew' then
  if cur ~= ARGV[3] or lapsed then
    return 0
  end
  redis.call('ZADD', KEYS[2], now, ARGV[2])
  return 1
elseif op == 'free' then
  if cur ~= ARGV[3] or not lapsed then
    return 0
  end
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 1
end
return redis.error_reply('lease.lua: unknown op ' .. tostring(op))
