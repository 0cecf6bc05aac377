package waitroom

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// Redis layout of one sale's queue (all keys under the sale's hash tag, see
// lua.QueueKey):
//
//	wr:{sN}:state     HASH seq (tickets handed out), n (pre-queue size, set
//	                  once at the draw), serving (places admitted: the "now
//	                  serving" cursor), last (ms up to which the rate's
//	                  credit has been spent)
//	wr:{sN}:tickets   HASH userId → ticket (0-based, in join order)
//	wr:{sN}:order     LIST userId, index = ticket (so LRANGE 0 n-1 is the
//	                  pre-queue in ticket order)
//	wr:{sN}:admitted  HASH userId → "place|admittedAtMs", written once
//	wr:{sN}:buckets   HASH "a<bucket>" → admissions in that time bucket,
//	                  "r<bucket>" → the sale's reservation counter
//	                  (lua.ReservedKey) when the bucket began (for the
//	                  capacity cap)
//	wr:{sN}:lease     STRING the leader gateway's id (SET NX PX)
//
// and one untagged key, activeKey, the SET of sale ids with a queue, so that
// every gateway ticks (and may lead) sales whose shoppers are elsewhere.
const (
	keyState    = "state"
	keyTickets  = "tickets"
	keyOrder    = "order"
	keyAdmitted = "admitted"
	keyBuckets  = "buckets"
	keyLease    = "lease"

	fieldSeq     = "seq"
	fieldN       = "n"
	fieldServing = "serving"

	// activeKey lists the sales with a queue. It has no hash tag: it is one
	// small SET read with SMEMBERS once per tick.
	activeKey = "wr:active"
)

// joinScript registers a batch of users and returns their tickets. Existing
// users keep their ticket, except a user whose admission expired, who goes
// to the back. It freezes the pre-queue (the draw) once now >= opensAt.
//
//	KEYS: state, tickets, order, admitted
//	ARGV: nowMs, opensAtMs, admissionTtlMs, userId...
//	returns {n or -1, serving, {ticket...}}
var joinScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
local n = redis.call('HGET', KEYS[1], 'n')
if not n and now >= tonumber(ARGV[2]) then
  n = redis.call('HGET', KEYS[1], 'seq') or '0'
  redis.call('HSET', KEYS[1], 'n', n)
end
local out = {}
for i = 4, #ARGV do
  local uid = ARGV[i]
  local t = redis.call('HGET', KEYS[2], uid)
  if t then
    local a = redis.call('HGET', KEYS[4], uid)
    if a then
      local at = tonumber(string.match(a, '|(%d+)$'))
      if at and at + ttl <= now then
        redis.call('HDEL', KEYS[4], uid)
        t = false
      end
    end
  end
  if not t then
    t = redis.call('HINCRBY', KEYS[1], 'seq', 1) - 1
    redis.call('HSET', KEYS[2], uid, t)
    redis.call('RPUSH', KEYS[3], uid)
  end
  out[#out + 1] = tonumber(t)
end
local serving = tonumber(redis.call('HGET', KEYS[1], 'serving') or '0')
return {n and tonumber(n) or -1, serving, out}
`)

// tickScript is run by every gateway for every active sale once per tick.
// It takes or renews the leader lease (SET NX PX); the leader freezes the
// pre-queue at opening and advances the cursor by the rate, within the
// capacity cap. Everyone gets the queue state back.
//
//	KEYS: state, lease, buckets, reserved (lua.ReservedKey)
//	ARGV: me, nowMs, opensAtMs, leaseMs, rate, capLimit (-1: do not
//	      admit), ttlMs, bucketMs
//	returns {leader 0/1, seq, n or -1, serving}
var tickScript = redis.NewScript(`
local me = ARGV[1]
local now = tonumber(ARGV[2])
local leader = 0
if redis.call('SET', KEYS[2], me, 'NX', 'PX', ARGV[4]) then
  leader = 1
elseif redis.call('GET', KEYS[2]) == me then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  leader = 1
end
if leader == 1 then
  local n = redis.call('HGET', KEYS[1], 'n')
  if not n and now >= tonumber(ARGV[3]) then
    n = redis.call('HGET', KEYS[1], 'seq') or '0'
    redis.call('HSET', KEYS[1], 'n', n)
  end
  local rate = tonumber(ARGV[5])
  local capLimit = tonumber(ARGV[6])
  if n and rate > 0 and capLimit >= 0 then
    local reserved = tonumber(redis.call('GET', KEYS[4]) or '0')
    local ttl = tonumber(ARGV[7])
    local bms = tonumber(ARGV[8])
    local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
    local serving = tonumber(redis.call('HGET', KEYS[1], 'serving') or '0')
    -- the rate's credit starts at the opening, so the first tick after it
    -- already admits what the time since the opening allows
    local last = tonumber(redis.call('HGET', KEYS[1], 'last') or ARGV[3])
    if last < now - 1000 then last = now - 1000 end
    local waiting = seq - serving
    -- capacity: admissions in the buckets younger than the token TTL, less
    -- the reservations made since the oldest of them began (a counter that
    -- units coming back to stock do not lower, so expiries and cancels do
    -- not make bought places look unused again).
    local b = math.floor(now / bms)
    local oldest = b + 1
    local sum = 0
    local h = redis.call('HGETALL', KEYS[3])
    for i = 1, #h, 2 do
      local f = h[i]
      local kb = tonumber(string.sub(f, 2))
      if (kb + 1) * bms <= now - ttl then
        redis.call('HDEL', KEYS[3], f)
      elseif string.sub(f, 1, 1) == 'a' then
        sum = sum + tonumber(h[i + 1])
        if kb < oldest then oldest = kb end
      end
    end
    if oldest <= b then
      local r0 = tonumber(redis.call('HGET', KEYS[3], 'r' .. oldest) or reserved)
      local sold = reserved - r0
      if sold > 0 then sum = sum - sold end
      if sum < 0 then sum = 0 end
    end
    local capLeft = capLimit - sum
    -- a caller whose clock reading is older than last (two loops of one
    -- gateway, or a late reply) gets nothing and moves nothing back
    local allowance = math.floor((now - last) * rate / 1000)
    if allowance < 0 then allowance = 0 end
    local k = allowance
    if waiting < k then k = waiting end
    if capLeft < k then k = capLeft end
    if k > 0 then
      redis.call('HINCRBY', KEYS[1], 'serving', k)
      redis.call('HINCRBY', KEYS[3], 'a' .. b, k)
      redis.call('HSETNX', KEYS[3], 'r' .. b, reserved)
    end
    if k < 0 then k = 0 end
    if k == allowance then
      last = last + k * 1000 / rate
    elseif now > last then
      last = now
    end
    redis.call('HSET', KEYS[1], 'last', string.format('%.3f', last))
  end
end
local st = redis.call('HMGET', KEYS[1], 'seq', 'n', 'serving')
return {leader, tonumber(st[1] or '0'), tonumber(st[2] or '-1'), tonumber(st[3] or '0')}
`)

// admitScript records the admission of users whose place the cursor has
// passed, once: the first record wins, so every gateway signs the same
// token. It refuses places the cursor has not reached.
//
//	KEYS: state, admitted
//	ARGV: nowMs, userId, place, userId, place...
//	returns {record or false ...} ("place|admittedAtMs")
var admitScript = redis.NewScript(`
local serving = tonumber(redis.call('HGET', KEYS[1], 'serving') or '0')
local out = {}
for i = 2, #ARGV, 2 do
  local uid = ARGV[i]
  local place = tonumber(ARGV[i + 1])
  local rec = redis.call('HGET', KEYS[2], uid)
  if not rec and place < serving then
    rec = ARGV[i + 1] .. '|' .. ARGV[1]
    redis.call('HSET', KEYS[2], uid, rec)
  end
  out[#out + 1] = rec
end
return out
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
}

// loadScripts loads every script (Redis 7 forgets them on restart; Run
// falls back to EVAL on NOSCRIPT outside pipelines anyway).
func loadScripts(ctx context.Context, rdb redis.UniversalClient) error {
	for _, s := range []*redis.Script{joinScript, tickScript, admitScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return err
		}
	}
	return nil
}

// registerJoins runs joinScript for one batch of one sale.
func registerJoins(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale, nowMs, ttlMs int64, users []int64) (queueState, []int64, error) {
	args := make([]any, 0, 3+len(users))
	args = append(args, nowMs, sale.StartsAt.UnixMilli(), ttlMs)
	for _, u := range users {
		args = append(args, u)
	}
	res, err := joinScript.Run(ctx, rdb, saleKeys(sale.ID, keyState, keyTickets, keyOrder, keyAdmitted), args...).Slice()
	if err != nil {
		return queueState{}, nil, fmt.Errorf("waitroom.join: %w", err)
	}
	if len(res) != 3 {
		return queueState{}, nil, errors.New("waitroom.join: bad script reply")
	}
	st := queueState{N: toInt(res[0]), Serving: toInt(res[1])}
	raw, _ := res[2].([]any)
	if len(raw) != len(users) {
		return queueState{}, nil, errors.New("waitroom.join: bad script reply")
	}
	tickets := make([]int64, len(raw))
	for i, v := range raw {
		tickets[i] = toInt(v)
	}
	return st, tickets, nil
}

type tickArgs struct {
	me       string
	nowMs    int64
	leaseMs  int64
	rate     int
	capLimit int64
	ttlMs    int64
	bucketMs int64
}

// tickSale runs tickScript for one sale.
func tickSale(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale, a tickArgs) (leader bool, st queueState, err error) {
	keys := append(saleKeys(sale.ID, keyState, keyLease, keyBuckets), lua.ReservedKey(sale.ID))
	res, err := tickScript.Run(ctx, rdb, keys,
		a.me, a.nowMs, sale.StartsAt.UnixMilli(), a.leaseMs, a.rate, a.capLimit, a.ttlMs, a.bucketMs).Slice()
	if err != nil {
		return false, st, fmt.Errorf("waitroom.tick: %w", err)
	}
	if len(res) != 4 {
		return false, st, errors.New("waitroom.tick: bad script reply")
	}
	return toInt(res[0]) == 1, queueState{Seq: toInt(res[1]), N: toInt(res[2]), Serving: toInt(res[3])}, nil
}

// admitUsers runs admitScript; recs[i] is the admission time of users[i]
// (0 when the cursor has not reached the place).
func admitUsers(ctx context.Context, rdb redis.UniversalClient, saleID, nowMs int64, users, places []int64) ([]int64, error) {
	args := make([]any, 0, 1+2*len(users))
	args = append(args, nowMs)
	for i, u := range users {
		args = append(args, u, places[i])
	}
	res, err := admitScript.Run(ctx, rdb, saleKeys(saleID, keyState, keyAdmitted), args...).Slice()
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
