package waitroom

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/lua"
)

// Redis layout of one sale's queue (all keys under the sale's hash tag, see
// lua.QueueKey):
//
//	wr:{sN}:state     HASH seq (tickets handed out), n (pre-queue size, set
//	                  once at the draw), serving (places admitted: the "now
//	                  serving" cursor), last (ms up to which the rate's
//	                  credit has been spent), live (set when this Redis
//	                  holds the queue: created fresh, or restored), epoch
//	                  (changed by a restore that found Redis behind:
//	                  every gateway that sees it change brings its own
//	                  connections in too); in queue order pausedat,
//	                  resumedat (a pause not yet added to the holds) and
//	                  holdslost (holds to rebuild after a loss), and
//	                  holdsgen (bumped whenever holders' admission
//	                  records change: holdpause.go, holdrestore.go);
//	                  tiered (set with n when the sale draws by tier)
//	wr:{sN}:tickets   HASH userId → ticket (0-based, in join order)
//	wr:{sN}:tiers     STRING a byte per pre-queue ticket: the tier ('1' to
//	                  '9') its holder joined with; no tier is a zero byte
//	                  (or '0'). Written for every tiered joiner before the
//	                  draw; read by a tiered draw (Draw)
//	wr:{sN}:order     LIST userId, index = ticket (so LRANGE 0 n-1 is the
//	                  pre-queue in ticket order); "0" marks a ticket whose
//	                  holder a restore could not learn (nobody is there)
//	wr:{sN}:admitted  HASH userId → "place|admittedAtMs", written once
//	                  (in queue order the leader moves a holder's time
//	                  by a pause, or closes it when its hold cannot be
//	                  rebuilt after a loss)
//	wr:{sN}:buckets   HASH "a<bucket>" → admissions in that time bucket,
//	                  "r<bucket>" → the sale's reservation counters
//	                  (redisstock.RoomKeys' and the other shards', summed)
//	                  when the bucket began, "g<bucket>"
//	                  → admitted shoppers of that bucket found gone (for
//	                  the capacity cap)
//	wr:{sN}:presence  ZSET userId → last time a gateway held a connection
//	                  (or answered a poll) of this admitted shopper, ms
//	wr:{sN}:gone      HASH userId → bucket of an admitted shopper counted
//	                  gone (in that bucket's "g" field) until it is back
//	wr:{sN}:holes     ZSET ticket → ticket, the "0" tickets of the order
//	                  list: a place nobody holds, which the cursor passes
//	                  and the capacity cap counts as gone at once
//	wr:{sN}:lease     STRING the leader gateway's id (SET NX PX)
//	wr:{sN}:helditem  HASH userId → the item held for the shopper in a
//	                  sale allocated in queue order (allocate.go), written
//	                  with the admission record
//	wr:{sN}:choice    HASH userId → the item the shopper chose for their
//	                  turn (queue order, choice.go)
//	wr:{sN}:fixed     HASH userId → ms until which the leader's pass holds
//	                  the choice fixed (a choose is refused meanwhile)
//	wr:{sN}:passed    HASH userId → place, of shoppers passed over for want
//	                  of their chosen item (they keep the place)
//	wr:{sN}:wants     ZSET (all scores 0) "item:place:userId", item and
//	                  place zero-padded: the passed shoppers by the item
//	                  they want, in place order (ZRANGEBYLEX)
//	wr:{sN}:idk       HASH identity key → the user whose place it holds
//	wr:{sN}:shadow, wr:{sN}:shadown, wr:{sN}:released
//	                  the shadow queue (shadow.go)
//
// and one untagged key, activeKey, the SET of sale ids with a queue, so that
// every gateway ticks (and may lead) sales whose shoppers are elsewhere.
//
// Every script that may create the queue takes a guard: when the calling
// gateway knows the queue existed (it saw tickets, the draw or the cursor,
// or PostgreSQL holds a checkpoint, see Durable) and this Redis holds no
// such state, or an older one (an empty restart, a failover to a replica
// that missed the last writes), the script changes nothing and says so;
// the gateway then restores the queue (restoreScript) before anything
// else. Without the guard the first join or tick after a loss would freeze
// an empty draw and hand out tickets that connected shoppers already hold.
const (
	keyState    = "state"
	keyTickets  = "tickets"
	keyOrder    = "order"
	keyAdmitted = "admitted"
	keyBuckets  = "buckets"
	keyPresence = "presence"
	keyGone     = "gone"
	keyHoles    = "holes"
	keyLease    = "lease"
	keyHeldItem = "helditem"
	keyIdentity = "idk" // identity key → the user whose place it holds
	keyTiers    = "tiers"

	fieldSeq     = "seq"
	fieldN       = "n"
	fieldServing = "serving"
	fieldTiered  = "tiered"

	// activeKey lists the sales with a queue. It has no hash tag: it is one
	// small SET read with SMEMBERS once per tick.
	activeKey = "wr:active"
)

// staleCheck is the Lua prelude of the guarded scripts: stale is true when
// this Redis does not hold the queue the caller knows (ARGV at base:
// knownSeq, knownN, knownServing, guard 0/1). A guard of 1 with no live
// marker means the queue existed and is gone; otherwise the caller only
// knows figures this Redis has not reached.
// capSoldOut is the tick's capLimit for a sale whose every item is sold
// out: admit nobody, and forget the admissions so far (the capacity cap
// counts admitted shoppers who have no answer yet, and at a sell-out every
// one has it). The units that come back are then offered to the next in
// line, up to the capacity factor, however many were admitted before.
const (
	capSoldOutN = -2
	capSoldOut  = "-2"
)

const staleCheck = `
local function stale(st, base)
  local live = redis.call('HGET', st, 'live')
  if not live then
    return ARGV[base + 3] == '1'
  end
  local v = redis.call('HMGET', st, 'seq', 'n', 'serving')
  if tonumber(v[1] or '0') < tonumber(ARGV[base]) then return true end
  if not v[2] and tonumber(ARGV[base + 1]) >= 0 then return true end
  if tonumber(v[3] or '0') < tonumber(ARGV[base + 2]) then return true end
  return false
end
`

// joinScript registers a batch of users and returns their tickets. Existing
// users keep their ticket, except a user whose admission expired, who goes
// to the back. It freezes the pre-queue (the draw) once now >= drawAt. A
// user whose identity key ("" for none) holds a place under another user
// gets no ticket (-3); the first user to join with a key keeps it, so one
// key holds one place, across gateways (one script decides). With
// shadowIdentity 1 such a user goes to the shadow queue instead (-4),
// unless an operator released them (-5: shadowed by this call). A user in
// the shadow queue (shadow.go) stays there (-4); the fourth answer holds
// the ticket shown to each -4 and -5. A pre-queue ticket's tier (1 to 9,
// 0 none) is kept in the tiers string; the draw uses them when the
// freezing call says the sale draws by tier (drawByTier 1). The sixth
// answer is each user's chosen item (0: none; queue order, choice.go),
// which the join's first status shows: read here, it costs the join no
// round trip of its own.
//
//	KEYS: state, tickets, order, admitted, presence, gone, idk, shadow,
//	      shadown, released, tiers, choice
//	ARGV: nowMs, drawAtMs, admissionTtlMs, knownSeq, knownN, knownServing,
//	      guard, shadowIdentity, drawByTier, then userId, identityKey,
//	      tier for each user
//	returns {n or -1, serving, {ticket or -3, -4, -5...}, {shown...},
//	tiered 0/1, {chosen...}}, or {-2} when the queue must be restored
//	first (see staleCheck)
var joinScript = redis.NewScript(staleCheck + `
if stale(KEYS[1], 4) then return {-2} end
redis.call('HSET', KEYS[1], 'live', '1')
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
local n = redis.call('HGET', KEYS[1], 'n')
if not n and now >= tonumber(ARGV[2]) then
  n = redis.call('HGET', KEYS[1], 'seq') or '0'
  redis.call('HSET', KEYS[1], 'n', n)
  if ARGV[9] == '1' then redis.call('HSET', KEYS[1], 'tiered', '1') end
end
local out, shown, chosen = {}, {}, {}
for i = 10, #ARGV, 3 do
  local uid, idk, tier = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local t = false
  shown[#shown + 1] = 0
  chosen[#chosen + 1] = tonumber(redis.call('HGET', KEYS[12], uid) or '0') or 0
  local sh = redis.call('HGET', KEYS[8], uid)
  if sh then
    t = -4
    shown[#shown] = tonumber(string.match(sh, '|(%d+)$'))
  elseif idk ~= '' then
    local owner = redis.call('HGET', KEYS[7], idk)
    if owner and owner ~= uid then
      t = -3
      if ARGV[8] == '1' and redis.call('SISMEMBER', KEYS[10], uid) == 0 then
        local seq = redis.call('HGET', KEYS[1], 'seq') or '0'
        redis.call('HSET', KEYS[8], uid, 'identity|' .. ARGV[1] .. '|' .. seq)
        redis.call('HINCRBY', KEYS[9], 'identity', 1)
        t = -5
        shown[#shown] = tonumber(seq)
      end
    elseif not owner then
      redis.call('HSET', KEYS[7], idk, uid)
    end
  end
  if t then
    out[#out + 1] = t
  else
  t = redis.call('HGET', KEYS[2], uid)
  if t then
    local a = redis.call('HGET', KEYS[4], uid)
    if a then
      local at = tonumber(string.match(a, '|(%d+)$'))
      if at and at + ttl <= now then
        redis.call('HDEL', KEYS[4], uid)
        redis.call('ZREM', KEYS[5], uid)
        redis.call('HDEL', KEYS[6], uid)
        t = false
      end
    end
  end
  if not t then
    t = redis.call('HINCRBY', KEYS[1], 'seq', 1) - 1
    redis.call('HSET', KEYS[2], uid, t)
    redis.call('RPUSH', KEYS[3], uid)
    if not n and tier ~= '0' then redis.call('SETRANGE', KEYS[11], t, tier) end
  end
  out[#out + 1] = tonumber(t)
  end
end
local serving = tonumber(redis.call('HGET', KEYS[1], 'serving') or '0')
local tiered = redis.call('HEXISTS', KEYS[1], 'tiered')
return {n and tonumber(n) or -1, serving, out, shown, tiered, chosen}
`)

// tickScript is run by every gateway for every active sale once per tick.
// It takes or renews the leader lease (SET NX PX); the leader freezes the
// pre-queue at the draw (DrawAt), admits the first wave between the draw
// and the opening (as many as the capacity cap allows, at once), counts
// admitted shoppers whose presence lapsed as gone, and from the opening
// advances the cursor by the rate, within the capacity cap.
// Everyone gets the queue state back. On a stale Redis (staleCheck) it
// changes nothing but the lease.
//
//	KEYS: state, lease, buckets, reserved and (at 8) buyers of
//	      redisstock.RoomKeys, read through redisstock.RoomLua, presence,
//	      gone, admitted, holes
//	ARGV: me, nowMs, "drawAtMs:opensAtMs:drawByTier", leaseMs, rate,
//	      capLimit (-1: do not
//	      admit; capSoldOut: admit nobody and forget every admission so
//	      far), ttlMs, bucketMs, graceMs (0: nobody is counted gone),
//	      knownSeq, knownN, knownServing, guard, and for a sale with stock
//	      shards (tickShardArgs): the other shards' reservations, userId
//	      (bought on another shard)...
//	returns {leader 0/1, seq, n or -1, serving, stale 0/1, epoch,
//	tiered 0/1}
var tickScript = redis.NewScript(staleCheck + redisstock.RoomLua + `
local me = ARGV[1]
local now = tonumber(ARGV[2])
local leader = 0
if redis.call('SET', KEYS[2], me, 'NX', 'PX', ARGV[4]) then
  leader = 1
elseif redis.call('GET', KEYS[2]) == me then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  leader = 1
end
if stale(KEYS[1], 10) then
  local st = redis.call('HMGET', KEYS[1], 'seq', 'n', 'serving', 'epoch', 'tiered')
  return {leader, tonumber(st[1] or '0'), tonumber(st[2] or '-1'), tonumber(st[3] or '0'), 1, st[4] or '', st[5] and 1 or 0}
end
if leader == 1 then
  redis.call('HSET', KEYS[1], 'live', '1')
  -- ARGV[3] is drawAtMs:opensAtMs:drawByTier: the pre-queue closes at
  -- the first, the rate's credit starts at the second
  local drawAt, opensAt, byTier = string.match(ARGV[3], '^(-?%d+):(-?%d+):([01])$')
  drawAt, opensAt = tonumber(drawAt), tonumber(opensAt)
  local n = redis.call('HGET', KEYS[1], 'n')
  if not n and now >= drawAt then
    n = redis.call('HGET', KEYS[1], 'seq') or '0'
    redis.call('HSET', KEYS[1], 'n', n)
    if byTier == '1' then redis.call('HSET', KEYS[1], 'tiered', '1') end
  end
  local ttl = tonumber(ARGV[7])
  local bms = tonumber(ARGV[8])
  -- admitted shoppers nobody has seen for the grace period: their places
  -- stop counting as outstanding (in the bucket of their admission, so the
  -- count leaves with the bucket). A buyer is counted by the reservation
  -- counter instead. One who comes back is taken off again (admitScript).
  local grace = tonumber(ARGV[9])
  if grace > 0 then
    local elsewhere = {}
    for i = 15, #ARGV do elsewhere[ARGV[i]] = true end
    local lapsed = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. (now - grace), 'LIMIT', 0, 1000)
    local abuckets -- the buckets holding admissions, read at the first need
    for _, uid in ipairs(lapsed) do
      redis.call('ZREM', KEYS[5], uid)
      if not stock_bought(KEYS[8], uid) and not elsewhere[uid] and redis.call('HEXISTS', KEYS[6], uid) == 0 then
        local a = redis.call('HGET', KEYS[7], uid)
        local at = a and tonumber(string.match(a, '|(%d+)$'))
        if at and at + ttl > now then
          -- the bucket that counted the admission: the record's time is the
          -- telling gateway's, which may be a broadcast's length before
          -- (a stale tick time) or after (told later) the leader's count,
          -- so the nearest bucket that holds admissions, within a minute
          if not abuckets then
            abuckets = {}
            local h = redis.call('HGETALL', KEYS[3])
            for i = 1, #h, 2 do
              if string.sub(h[i], 1, 1) == 'a' then abuckets[tonumber(string.sub(h[i], 2))] = true end
            end
          end
          local kb = math.floor(at / bms)
          local cb
          for d = 0, 60 do
            if abuckets[kb - d] then cb = kb - d break end
            if abuckets[kb + d] then cb = kb + d break end
          end
          if cb then
            redis.call('HINCRBY', KEYS[3], 'g' .. cb, 1)
            redis.call('HSET', KEYS[6], uid, cb)
          end
        end
      end
    end
  end
  local rate = tonumber(ARGV[5])
  local capLimit = tonumber(ARGV[6])
  if capLimit == ` + capSoldOut + ` then
    -- sold out: every admitted shopper has a final answer (a unit, or
    -- SOLD_OUT), so no admission so far counts against the cap of the
    -- units that come back; those go to the next in line
    redis.call('DEL', KEYS[3], KEYS[6])
    -- and the rate's credit does not build up while nobody can be
    -- admitted (as under a cap with no room left)
    local last = tonumber(redis.call('HGET', KEYS[1], 'last') or opensAt)
    if n and now >= opensAt and now > last then redis.call('HSET', KEYS[1], 'last', now) end
  end
  if n and rate > 0 and capLimit >= 0 then
    local reserved = stock_reserved(KEYS[4]) + tonumber(ARGV[14] or '0')
    local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
    local serving = tonumber(redis.call('HGET', KEYS[1], 'serving') or '0')
    -- the rate's credit starts at the opening, so the first tick after it
    -- already admits what the time since the opening allows
    local last = tonumber(redis.call('HGET', KEYS[1], 'last') or opensAt)
    if last < now - 1000 then last = now - 1000 end
    local waiting = seq - serving
    -- capacity: admissions in the buckets younger than the token TTL, less
    -- those found gone, less the reservations made since the oldest of them
    -- began (a counter that units coming back to stock do not lower, so
    -- expiries and cancels do not make bought places look unused again).
    local b = math.floor(now / bms)
    local oldest = b + 1
    local sum = 0
    local h = redis.call('HGETALL', KEYS[3])
    for i = 1, #h, 2 do
      local f = h[i]
      local kb = tonumber(string.sub(f, 2))
      local kind = string.sub(f, 1, 1)
      if (kb + 1) * bms <= now - ttl then
        redis.call('HDEL', KEYS[3], f)
      elseif kind == 'a' then
        sum = sum + tonumber(h[i + 1])
        if kb < oldest then oldest = kb end
      elseif kind == 'g' then
        sum = sum - tonumber(h[i + 1])
      end
    end
    if oldest <= b then
      local r0 = tonumber(redis.call('HGET', KEYS[3], 'r' .. oldest) or reserved)
      local sold = reserved - r0
      if sold > 0 then sum = sum - sold end
    end
    if sum < 0 then sum = 0 end
    local capLeft = capLimit - sum
    -- a caller whose clock reading is older than last (two loops of one
    -- gateway, or a late reply) gets nothing and moves nothing back
    local allowance = math.floor((now - last) * rate / 1000)
    if allowance < 0 then allowance = 0 end
    -- between the draw and the opening: the first wave, as many as the
    -- cap allows, with no rate (their tokens buy from the opening); the
    -- rate's credit still starts at the opening
    local early = now < opensAt and drawAt < opensAt
    if early then allowance = waiting end
    local k = allowance
    if waiting < k then k = waiting end
    if capLeft < k then k = capLeft end
    if k > 0 then
      redis.call('HINCRBY', KEYS[1], 'serving', k)
      redis.call('HINCRBY', KEYS[3], 'a' .. b, k)
      redis.call('HSETNX', KEYS[3], 'r' .. b, reserved)
      -- places nobody holds (tickets a restore could not learn; after the
      -- pre-queue a place is its ticket) are gone as soon as admitted
      local from = math.max(serving, tonumber(n))
      if serving + k > from then
        local holes = redis.call('ZCOUNT', KEYS[9], from, serving + k - 1)
        if holes > 0 then
          redis.call('HINCRBY', KEYS[3], 'g' .. b, holes)
          redis.call('ZREMRANGEBYSCORE', KEYS[9], from, serving + k - 1)
        end
      end
    end
    if k < 0 then k = 0 end
    if early then
      -- last stays unset: the credit starts at the opening
    elseif k == allowance then
      last = last + k * 1000 / rate
    elseif now > last then
      last = now
    end
    if not early then redis.call('HSET', KEYS[1], 'last', string.format('%.3f', last)) end
  end
end
local st = redis.call('HMGET', KEYS[1], 'seq', 'n', 'serving', 'epoch', 'tiered')
return {leader, tonumber(st[1] or '0'), tonumber(st[2] or '-1'), tonumber(st[3] or '0'), 0, st[4] or '', st[5] and 1 or 0}
`)

// admitScript records the admission of users whose place the cursor has
// passed, once: the first record wins, so every gateway signs the same
// token. It refuses places the cursor has not reached. With create 0 (a
// sale allocated in queue order, whose records only the leader writes, at
// a hold: admitHeldScript) it only reads them. Every admitted user it is
// called for is marked present now (a gateway holds its connection or
// answers its poll); one counted gone is taken off the gone count.
//
//	KEYS: state, admitted, presence, gone, buckets
//	ARGV: nowMs, create (1/0), userId, place, userId, place...
//	returns {record or false ...} ("place|admittedAtMs")
var admitScript = redis.NewScript(`
local serving = tonumber(redis.call('HGET', KEYS[1], 'serving') or '0')
local out = {}
for i = 3, #ARGV, 2 do
  local uid = ARGV[i]
  local place = tonumber(ARGV[i + 1])
  local rec = redis.call('HGET', KEYS[2], uid)
  if not rec and place < serving and ARGV[2] == '1' then
    rec = ARGV[i + 1] .. '|' .. ARGV[1]
    redis.call('HSET', KEYS[2], uid, rec)
  end
  if rec then
    redis.call('ZADD', KEYS[3], 'GT', ARGV[1], uid)
    local kb = redis.call('HGET', KEYS[4], uid)
    if kb then
      redis.call('HDEL', KEYS[4], uid)
      if redis.call('HEXISTS', KEYS[5], 'g' .. kb) == 1 then
        redis.call('HINCRBY', KEYS[5], 'g' .. kb, -1)
      end
    end
  end
  out[#out + 1] = rec
end
return out
`)

// restoreScript rebuilds a queue that this Redis lost, or holds only in
// part, from what the calling gateway knows: the tickets PostgreSQL
// checkpointed (Durable) and its own connections. It only adds: tickets
// beyond this Redis's are appended, known figures raise its own, and
// admission records are written where none is. Several gateways may run
// it, in any order; each brings its own connections. A restore that finds
// Redis behind (no queue, or lower figures than it brings) sets a new
// epoch, so that the other gateways learn that they must bring theirs;
// one that only adds connections keeps the epoch (no gateway restores
// twice for one loss).
//
//	KEYS: state, tickets, order, admitted, buckets, presence, buyers,
//	      reserved (redisstock.RoomKeys, read through redisstock.RoomLua),
//	      holes, tiers
//	ARGV: nowMs, newEpoch, ttlMs, bucketMs, seq (tickets known: the order
//	      list is padded to it), n (-1 unknown), serving, P (checkpointed
//	      tickets 0..P-1 that follow), the other stock shards'
//	      reservations, B, tiered (1: the draw is by tier), the
//	      checkpointed tickets' tiers (a digit each, "" for none), userId
//	      (bought on another shard) × B, userId × P, then per connection:
//	      userId, ticket, place (-1 unknown), admittedAtMs (0: none), tier
//	returns {seq, n or -1, serving, epoch, tiered 0/1}
var restoreScript = redis.NewScript(redisstock.RoomLua + `
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
local bms = tonumber(ARGV[4])
local cur0 = redis.call('HMGET', KEYS[1], 'live', 'seq', 'n', 'serving')
local seq = tonumber(cur0[2] or '0')
local behind = not cur0[1] or seq < tonumber(ARGV[5]) or seq < tonumber(ARGV[8])
  or (not cur0[3] and tonumber(ARGV[6]) >= 0) or tonumber(cur0[4] or '0') < tonumber(ARGV[7])
if behind then redis.call('HSET', KEYS[1], 'epoch', ARGV[2]) end
local function pad(upto)
  local buf = {}
  while seq < upto do
    buf[#buf + 1] = '0'
    redis.call('ZADD', KEYS[9], seq, seq)
    seq = seq + 1
    if #buf == 1000 then redis.call('RPUSH', KEYS[3], unpack(buf)); buf = {} end
  end
  if #buf > 0 then redis.call('RPUSH', KEYS[3], unpack(buf)) end
end
local p = tonumber(ARGV[8])
local elsewhere = {}
for i = 13, 12 + tonumber(ARGV[10]) do elsewhere[ARGV[i]] = true end
local base = 12 + tonumber(ARGV[10])
local n0 = redis.call('HGET', KEYS[1], 'n') or ARGV[6]
if p > seq then
  -- the checkpointed tiers of the tickets this Redis lacks
  if #ARGV[12] > seq then
    redis.call('SETRANGE', KEYS[10], seq, string.sub(ARGV[12], seq + 1, p))
  end
  local buf = {}
  for t = seq, p - 1 do
    local uid = ARGV[base + 1 + t]
    buf[#buf + 1] = uid
    if uid ~= '0' then
      redis.call('HSET', KEYS[2], uid, t)
    else
      redis.call('ZADD', KEYS[9], t, t)
    end
    if #buf == 1000 then redis.call('RPUSH', KEYS[3], unpack(buf)); buf = {} end
  end
  if #buf > 0 then redis.call('RPUSH', KEYS[3], unpack(buf)) end
  seq = p
end
local reserved = stock_reserved(KEYS[8]) + tonumber(ARGV[9])
-- a connection's tier, for a pre-queue ticket that had no holder here
local function settier(t, tier)
  if tier ~= '0' and (tonumber(n0) < 0 or t < tonumber(n0)) then
    redis.call('SETRANGE', KEYS[10], t, tier)
  end
end
for i = base + p + 1, #ARGV, 5 do
  local uid, t = ARGV[i], tonumber(ARGV[i + 1])
  local place, at = ARGV[i + 2], tonumber(ARGV[i + 3])
  if t >= seq then
    pad(t)
    redis.call('RPUSH', KEYS[3], uid)
    settier(t, ARGV[i + 4])
    seq = t + 1
  else
    local cur = redis.call('HGET', KEYS[2], uid)
    if cur ~= tostring(t) and redis.call('LINDEX', KEYS[3], t) == '0' then
      redis.call('LSET', KEYS[3], t, uid)
      redis.call('ZREM', KEYS[9], t)
      settier(t, ARGV[i + 4])
    end
  end
  local cur = tonumber(redis.call('HGET', KEYS[2], uid) or '-1')
  if cur < t then redis.call('HSET', KEYS[2], uid, t) end
  if at > 0 and at + ttl > now and tonumber(place) >= 0 then
    if redis.call('HSETNX', KEYS[4], uid, place .. '|' .. at) == 1
        and not stock_bought(KEYS[7], uid) and not elsewhere[uid] then
      -- an admitted shopper still here counts against the cap again, in
      -- the bucket of its admission
      local kb = math.floor(at / bms)
      redis.call('HINCRBY', KEYS[5], 'a' .. kb, 1)
      redis.call('HSETNX', KEYS[5], 'r' .. kb, reserved)
    end
    redis.call('ZADD', KEYS[6], 'GT', now, uid)
  end
end
pad(tonumber(ARGV[5]))
redis.call('HSET', KEYS[1], 'seq', seq)
local n = redis.call('HGET', KEYS[1], 'n')
if not n and tonumber(ARGV[6]) >= 0 then
  n = ARGV[6]
  redis.call('HSET', KEYS[1], 'n', n)
  if ARGV[11] == '1' then redis.call('HSET', KEYS[1], 'tiered', '1') end
end
local serving = tonumber(redis.call('HGET', KEYS[1], 'serving') or '0')
if tonumber(ARGV[7]) > serving then
  serving = tonumber(ARGV[7])
  redis.call('HSET', KEYS[1], 'serving', serving)
end
if not redis.call('HGET', KEYS[1], 'last') then
  redis.call('HSET', KEYS[1], 'last', now)
end
redis.call('HSET', KEYS[1], 'live', '1')
return {seq, n and tonumber(n) or -1, serving, redis.call('HGET', KEYS[1], 'epoch') or '',
  redis.call('HEXISTS', KEYS[1], 'tiered')}
`)

func saleKeys(saleID int64, suffixes ...string) []string {
	k := make([]string, len(suffixes))
	for i, s := range suffixes {
		k[i] = lua.QueueKey(saleID, s)
	}
	return k
}

// queueState is the shared state of one sale's queue.
type queueState struct {
	Seq     int64 // tickets handed out
	N       int64 // pre-queue size; -1 before the draw
	Serving int64 // places admitted
	Tiered  bool  // the draw is by tier (set with N)
}

// known is what a gateway knows of a queue, for the scripts' guard
// (staleCheck): the highest figures it has seen, and whether the queue
// existed at all.
type known struct {
	st    queueState
	guard bool
}

func (k known) args() []any {
	g := 0
	if k.guard {
		g = 1
	}
	return []any{k.st.Seq, k.st.N, k.st.Serving, g}
}

// errStale reports that Redis does not hold the queue the gateway knows:
// it must be restored (Room.restore) before joins and ticks go on.
var errStale = errors.New("waitroom: the queue in Redis is missing or behind; restoring")

// loadScripts loads every script. Redis forgets scripts on a restart;
// Script.Run (every call of this package) falls back to EVAL on NOSCRIPT
// and so loads them again.
func loadScripts(ctx context.Context, rdb redis.UniversalClient) error {
	for _, s := range []*redis.Script{joinScript, tickScript, admitScript, restoreScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return fmt.Errorf("waitroom.loadScripts: %w", err)
		}
	}
	return nil
}

// registerJoins runs joinScript for one batch of one sale. It returns
// errStale when the queue must be restored first.
func registerJoins(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale, lead time.Duration, nowMs, ttlMs int64, kn known, shadowIdentity bool, qs []*joinReq) (queueState, []joinTicket, error) {
	args := make([]any, 0, 9+3*len(qs))
	args = append(args, nowMs, DrawAt(sale, lead).UnixMilli(), ttlMs)
	args = append(args, kn.args()...)
	args = append(args, boolArg(shadowIdentity), boolArg(sale.Access.DrawByTier))
	for _, q := range qs {
		args = append(args, q.user, q.idk, q.tier)
	}
	res, err := joinScript.Run(ctx, rdb, saleKeys(sale.ID, keyState, keyTickets, keyOrder, keyAdmitted, keyPresence, keyGone, keyIdentity,
		keyShadow, keyShadowN, keyReleased, keyTiers, keyChoice), args...).Slice()
	if err != nil {
		return queueState{}, nil, fmt.Errorf("waitroom.join: %w", err)
	}
	if len(res) == 1 && toInt(res[0]) == -2 {
		return queueState{}, nil, errStale
	}
	if len(res) != 6 {
		return queueState{}, nil, errors.New("waitroom.join: bad script reply")
	}
	st := queueState{N: toInt(res[0]), Serving: toInt(res[1]), Tiered: toInt(res[4]) == 1}
	raw, _ := res[2].([]any)
	shown, _ := res[3].([]any)
	chosen, _ := res[5].([]any)
	if len(raw) != len(qs) || len(shown) != len(qs) || len(chosen) != len(qs) {
		return queueState{}, nil, errors.New("waitroom.join: bad script reply")
	}
	out := make([]joinTicket, len(raw))
	for i, v := range raw {
		out[i] = joinTicket{ticket: toInt(v), shown: toInt(shown[i]), chosen: toInt(chosen[i])}
	}
	return st, out, nil
}

// joinTicket is joinScript's answer for one user: a ticket, ticketDuplicate,
// or ticketShadowed with the ticket shown; and the item the user chose
// before (queue order; 0: none).
type joinTicket struct{ ticket, shown, chosen int64 }

type tickArgs struct {
	me       string
	nowMs    int64
	drawAtMs int64 // DrawAt: the pre-queue closes and the first wave is admitted
	leaseMs  int64
	rate     int
	capLimit int64
	ttlMs    int64
	bucketMs int64
	graceMs  int64
	known    known
}

// tickReply is what tickScript answers.
type tickReply struct {
	leader bool
	st     queueState
	stale  bool   // the queue must be restored (nothing but the lease was touched)
	epoch  string // the queue's restore epoch ("" before any restore)
}

// tickSale runs tickScript for one sale.
func tickSale(ctx context.Context, rdb redis.UniversalClient, st *redisstock.Store, sale *flashsale.Sale, a tickArgs) (tickReply, error) {
	reserved, buyers := redisstock.RoomKeys(sale.ID)
	keys := append(saleKeys(sale.ID, keyState, keyLease, keyBuckets), reserved)
	keys = append(keys, saleKeys(sale.ID, keyPresence, keyGone, keyAdmitted)...)
	keys = append(keys, buyers, lua.QueueKey(sale.ID, keyHoles))
	draw := strconv.FormatInt(a.drawAtMs, 10) + ":" + strconv.FormatInt(sale.StartsAt.UnixMilli(), 10) + ":" + strconv.Itoa(boolArg(sale.Access.DrawByTier))
	args := []any{a.me, a.nowMs, draw, a.leaseMs, a.rate, a.capLimit, a.ttlMs, a.bucketMs, a.graceMs}
	args = append(args, a.known.args()...)
	more, err := tickShardArgs(ctx, rdb, st, sale, a)
	if err != nil {
		return tickReply{}, fmt.Errorf("waitroom.tick: %w", err)
	}
	args = append(args, more...)
	res, err := tickScript.Run(ctx, rdb, keys, args...).Slice()
	if err != nil {
		return tickReply{}, fmt.Errorf("waitroom.tick: %w", err)
	}
	if len(res) != 7 {
		return tickReply{}, errors.New("waitroom.tick: bad script reply")
	}
	epoch, _ := res[5].(string)
	return tickReply{leader: toInt(res[0]) == 1, st: queueState{Seq: toInt(res[1]), N: toInt(res[2]), Serving: toInt(res[3]), Tiered: toInt(res[6]) == 1},
		stale: toInt(res[4]) == 1, epoch: epoch}, nil
}

// admitUsers runs admitScript; recs[i] is the admission time of users[i]
// (0 when the cursor has not reached the place, or, without create, no
// record exists). Every admitted user among them is marked present.
func admitUsers(ctx context.Context, rdb redis.UniversalClient, saleID, nowMs int64, create bool, users, places []int64) ([]int64, error) {
	args := make([]any, 0, 2+2*len(users))
	args = append(args, nowMs, boolArg(create))
	for i, u := range users {
		args = append(args, u, places[i])
	}
	res, err := admitScript.Run(ctx, rdb, saleKeys(saleID, keyState, keyAdmitted, keyPresence, keyGone, keyBuckets), args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("waitroom.admit: %w", err)
	}
	at := make([]int64, len(users))
	for i := range at {
		if i >= len(res) {
			break
		}
		if s, ok := res[i].(string); ok {
			if _, ms, err := parseAdmission(s); err == nil {
				at[i] = ms
			}
		}
	}
	return at, nil
}

// heldConn is one connection's part of a restore.
type heldConn struct {
	user, ticket, place, admittedAt int64
	tier                            int
}

// restoreInput is what one gateway brings to a restore.
type restoreInput struct {
	nowMs, ttlMs int64
	epoch        string     // set when this restore finds Redis behind
	st           queueState // the highest figures known (checkpoint or memory)
	users        []int64    // checkpointed tickets 0..len-1 (0: unknown holder)
	tiers        []byte     // their tiers, a digit each (nil: none)
	conns        []heldConn
	// a sale's other stock shards (restoreShardArgs)
	otherReserved   int64
	boughtElsewhere []int64
}

// restoreQueue runs restoreScript for one sale; it returns the queue's
// figures and epoch after the restore.
func restoreQueue(ctx context.Context, rdb redis.UniversalClient, saleID int64, in restoreInput) (queueState, string, error) {
	keys := saleKeys(saleID, keyState, keyTickets, keyOrder, keyAdmitted, keyBuckets, keyPresence)
	reserved, buyers := redisstock.RoomKeys(saleID)
	keys = append(keys, buyers, reserved, lua.QueueKey(saleID, keyHoles), lua.QueueKey(saleID, keyTiers))
	args := make([]any, 0, 12+len(in.boughtElsewhere)+len(in.users)+5*len(in.conns))
	args = append(args, in.nowMs, in.epoch, in.ttlMs, int64(bucketMs), in.st.Seq, in.st.N, in.st.Serving, len(in.users),
		in.otherReserved, len(in.boughtElsewhere), boolArg(in.st.Tiered), string(in.tiers))
	for _, u := range in.boughtElsewhere {
		args = append(args, u)
	}
	for _, u := range in.users {
		args = append(args, u)
	}
	for _, c := range in.conns {
		args = append(args, c.user, c.ticket, c.place, c.admittedAt, c.tier)
	}
	res, err := restoreScript.Run(ctx, rdb, keys, args...).Slice()
	if err != nil {
		return queueState{}, "", fmt.Errorf("waitroom.restore: %w", err)
	}
	if len(res) != 5 {
		return queueState{}, "", errors.New("waitroom.restore: bad script reply")
	}
	// activeKey has no hash tag: apart from the script (Redis Cluster).
	if err := rdb.SAdd(ctx, activeKey, saleID).Err(); err != nil {
		return queueState{}, "", fmt.Errorf("waitroom.restore: %w", err)
	}
	epoch, _ := res[3].(string)
	return queueState{Seq: toInt(res[0]), N: toInt(res[1]), Serving: toInt(res[2]), Tiered: toInt(res[4]) == 1}, epoch, nil
}

func boolArg(b bool) int {
	if b {
		return 1
	}
	return 0
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	default:
		return 0
	}
}
