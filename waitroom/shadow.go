package waitroom

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// The shadow queue. A join that a shadowing rule judges (the bot
// defense's settings, shadowQueue) is not refused: the shopper gets a
// ticket of its own that no queue holds, and a waiting page like anyone's,
// whose place moves with the cursor but never reaches it. A shadowed
// shopper is never admitted, holds nothing and is never told; once
// shadowed, every later join of the user in the sale is shadowed too (a
// reconnect from a clean address learns nothing), until an operator
// releases them.
//
// Redis, under the sale's hash tag:
//
//	wr:{sN}:shadow    HASH userId → "rule|atMs|ticket": the rule that
//	                  shadowed the shopper, when, and the ticket shown
//	                  (the queue's seq when shadowed)
//	wr:{sN}:shadown   HASH rule → shoppers shadowed by it (never
//	                  decremented: the console's "why"); "released" →
//	                  shoppers released
//	wr:{sN}:released  SET userId: released by an operator; no rule
//	                  shadows them again in this sale
//
// A shadowed shopper costs one script call at join, as a join does, and
// nothing per message: a choose is answered from the connection's memory.
// The waiting room's gateways look up their own shadowed connections
// every shadowCheckEvery (one HMGET per sale that has any) to find the
// released ones, whom they close with "going away": the page joins again
// and the join is judged afresh.
const (
	keyShadow   = "shadow"
	keyShadowN  = "shadown"
	keyReleased = "released"

	// ticketShadowed is joinScript's ticket for a shadowed user (the
	// ticket shown is in its fourth answer), ticketShadowedNew for one it
	// shadowed (shadowQueue's identity rule).
	ticketShadowed    = -4
	ticketShadowedNew = -5

	shadowCheckEvery = 2 * time.Second

	// shadowCapFactor: with shadowQueue's perAddress rule, WebSockets of
	// an address over its cap (Config.MaxConnsPerIP) go to the shadow
	// queue, up to this many times the cap; past it they are refused.
	shadowCapFactor = 4
)

// Shadow rules: what put a shopper in the shadow queue (the defense's
// shadowQueue settings name them).
const (
	ShadowBlocklist  = "blocklist"  // on the blocklist
	ShadowPow        = "pow"        // a failed or skipped proof of work
	ShadowPerAddress = "perAddress" // over the WebSockets per address (IPv6: per /64)
	ShadowRisk       = "risk"       // the token's risk claim above the threshold
	ShadowIdentity   = "identity"   // a second user id of an identity key
)

// Shadower is implemented by a JoinGuard whose settings may shadow rather
// than refuse (*defense.Guard does): Shadows reports whether a join that
// rule would refuse goes to the shadow queue; ShadowRisk is the risk claim
// above which a join is shadowed (0: none is).
type Shadower interface {
	Shadows(rule string) bool
	ShadowRisk() float64
}

func (r *Room) shadower() Shadower {
	s, _ := r.guard.(Shadower)
	return s
}

// shadows reports whether the guard's settings shadow rule.
func (r *Room) shadows(rule string) bool {
	s := r.shadower()
	return s != nil && s.Shadows(rule)
}

// riskRule is the shadow rule p's risk claim trips ("" none).
func (r *Room) riskRule(p flashsale.Principal) string {
	if s := r.shadower(); s != nil {
		if t := s.ShadowRisk(); t > 0 && p.Risk > t {
			return ShadowRisk
		}
	}
	return ""
}

// shadowScript shadows a user, unless released: it returns {ticket
// shown, 1 if shadowed by this call} (the ticket first shown, if shadowed
// before), or {-1} for a released user, whom the caller joins as anyone.
//
//	KEYS: state, shadow, shadown, released
//	ARGV: userId, rule, nowMs
var shadowScript = redis.NewScript(`
if redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 1 then return {-1} end
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v then return {tonumber(string.match(v, '|(%d+)$')), 0} end
local t = redis.call('HGET', KEYS[1], 'seq') or '0'
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. '|' .. ARGV[3] .. '|' .. t)
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
return {tonumber(t), 1}
`)

// shadowJoin puts the user in the sale's shadow queue for rule. shadowed
// is false for a user an operator released: the caller joins them as
// anyone.
func (r *Room) shadowJoin(ctx context.Context, sale *flashsale.Sale, userID int64, rule string) (ticket int64, sr *saleRoom, shadowed bool, err error) {
	sr = r.saleRoom(sale.ID, true)
	res, err := shadowScript.Run(ctx, r.rdb, saleKeys(sale.ID, keyState, keyShadow, keyShadowN, keyReleased),
		userID, rule, r.cfg.Now().UnixMilli()).Int64Slice()
	if err != nil {
		return 0, nil, false, fmt.Errorf("waitroom.shadowJoin: %w", err)
	}
	if len(res) == 0 || res[0] < 0 {
		return 0, nil, false, nil
	}
	if len(res) == 2 && res[1] == 1 {
		r.m.shadowed.WithLabelValues(rule).Inc()
		r.tally.shadowed(sale.ID, r.cfg.Now(), rule)
	}
	t := res[0]
	if err := r.ensureLoaded(ctx, sr, queueState{N: -1}); err != nil {
		return 0, nil, false, err
	}
	return t, sr, true, nil
}

// joinRule is the shadow rule a join trips before it reaches the queue:
// the guard's verdict (a *flashsale.Shadow), the risk claim, or the
// per-address cap the connection was accepted over. "" none.
func (r *Room) joinRule(guardErr error, p flashsale.Principal, overCap bool) string {
	var sh *flashsale.Shadow
	switch {
	case errors.As(guardErr, &sh):
		return sh.Rule
	case overCap:
		return ShadowPerAddress
	}
	return r.riskRule(p)
}

// mix is splitmix64's finalizer: the same spread of a user on every
// gateway, so that a reconnect elsewhere shows the same place.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// shadowGap is how far behind the cursor a shadowed shopper's place stays
// at least: a few places, fixed per user, so that it looks like a
// queue's front that a slow crowd ahead holds up.
func shadowGap(user int64) int64 {
	return 3 + int64(mix(uint64(user))%37)
}

// shadowPlace is the place a shadowed shopper with ticket t sees: a
// pre-queue ticket at a place spread over the pre-queue (as a drawn one
// would be), a later one at its ticket, and never fewer than its gap
// behind the cursor. Called with sr.mu held.
func (sr *saleRoom) shadowPlace(t, user int64) int64 {
	if sr.st.N < 0 {
		return -1
	}
	p := t
	if t < sr.st.N {
		p = int64(mix(uint64(user)^mix(uint64(sr.id))) % uint64(sr.st.N))
	}
	return max(p, sr.st.Serving+shadowGap(user))
}

// checkShadowed looks up the sale's shadowed connections on this gateway
// (every shadowCheckEvery) and closes those whose shopper an operator
// released, with "going away": the page joins again, as anyone.
func (r *Room) checkShadowed(ctx context.Context, sr *saleRoom, now time.Time) {
	sr.mu.Lock()
	if now.Sub(sr.shadowChecked) < shadowCheckEvery {
		sr.mu.Unlock()
		return
	}
	sr.shadowChecked = now
	var conns []*conn
	var users []string
	for c := range sr.shadowed {
		conns = append(conns, c)
		users = append(users, strconv.FormatInt(c.user, 10))
	}
	sr.mu.Unlock()
	if len(conns) == 0 {
		return
	}
	v, err := r.rdb.HMGet(ctx, lua.QueueKey(sr.id, keyShadow), users...).Result()
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("read shadowed shoppers", "sale", sr.id, "err", err)
		}
		return
	}
	for i, x := range v {
		if x == nil {
			conns[i].goAway()
		}
	}
}

// ShadowedShopper is one shopper in a sale's shadow queue.
type ShadowedShopper struct {
	UserID int64     `json:"userId"`
	Rule   string    `json:"rule"`
	At     time.Time `json:"at"`
}

// ShadowQueue is what the console shows of a sale's shadow queue.
type ShadowQueue struct {
	// Shadowed is how many are in it now; ByRule how many each rule put
	// there since the sale began, and Released how many an operator
	// released.
	Shadowed int64            `json:"shadowed"`
	ByRule   map[string]int64 `json:"byRule"`
	Released int64            `json:"released"`
	// Shoppers are the earliest shadowed (up to the limit asked), oldest
	// first.
	Shoppers []ShadowedShopper `json:"shoppers"`
}

// maxShadowList bounds the shoppers one ShadowList reads.
const maxShadowList = 1000

// ShadowList reads the sale's shadow queue: its counts, and up to limit
// of its shoppers (at most maxShadowList; the oldest first among those
// read).
func (r *Room) ShadowList(ctx context.Context, saleID int64, limit int) (ShadowQueue, error) {
	limit = min(max(limit, 0), maxShadowList)
	q := ShadowQueue{ByRule: map[string]int64{}, Shoppers: []ShadowedShopper{}}
	pipe := r.rdb.Pipeline()
	n := pipe.HLen(ctx, lua.QueueKey(saleID, keyShadow))
	counts := pipe.HGetAll(ctx, lua.QueueKey(saleID, keyShadowN))
	if _, err := pipe.Exec(ctx); err != nil {
		return q, fmt.Errorf("waitroom.ShadowList: %w", err)
	}
	q.Shadowed = n.Val()
	for k, v := range counts.Val() {
		c, _ := strconv.ParseInt(v, 10, 64)
		if k == "released" {
			q.Released = c
			continue
		}
		q.ByRule[k] = c
	}
	var cursor uint64
	for len(q.Shoppers) < limit {
		kv, next, err := r.rdb.HScan(ctx, lua.QueueKey(saleID, keyShadow), cursor, "", int64(min(limit, 500))).Result()
		if err != nil {
			return q, fmt.Errorf("waitroom.ShadowList: %w", err)
		}
		for i := 0; i+1 < len(kv) && len(q.Shoppers) < limit; i += 2 {
			if s, ok := parseShadowed(kv[i], kv[i+1]); ok {
				q.Shoppers = append(q.Shoppers, s)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	sort.Slice(q.Shoppers, func(i, j int) bool {
		a, b := q.Shoppers[i], q.Shoppers[j]
		return a.At.Before(b.At) || a.At.Equal(b.At) && a.UserID < b.UserID
	})
	return q, nil
}

// shadowRecord is a value of the shadow hash: "rule|atMs|ticket".
type shadowRecord struct {
	rule         string
	atMs, ticket int64
}

// parseShadowRecord reads a value of the shadow hash.
func parseShadowRecord(v string) (shadowRecord, bool) {
	parts := strings.Split(v, "|")
	if len(parts) != 3 {
		return shadowRecord{}, false
	}
	ms, err1 := strconv.ParseInt(parts[1], 10, 64)
	t, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		return shadowRecord{}, false
	}
	return shadowRecord{rule: parts[0], atMs: ms, ticket: t}, true
}

// parseShadowed reads a field and value of the shadow hash.
func parseShadowed(user, v string) (ShadowedShopper, bool) {
	id, err := strconv.ParseInt(user, 10, 64)
	rec, ok := parseShadowRecord(v)
	if err != nil || !ok {
		return ShadowedShopper{}, false
	}
	return ShadowedShopper{UserID: id, Rule: rec.rule, At: time.UnixMilli(rec.atMs).UTC()}, true
}

// releaseScript takes a user out of the shadow queue for good in this
// sale: 1 if they were in it, 0 if not (nothing changes).
//
//	KEYS: shadow, shadown, released
//	ARGV: userId
var releaseScript = redis.NewScript(`
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[2], 'released', 1)
return 1
`)

// ReleaseShadowed takes the user out of the sale's shadow queue: no rule
// shadows them again in this sale, and the gateway holding their page
// closes it within shadowCheckEvery, so that it joins again as anyone's.
// A user not in the shadow queue is NOT_FOUND.
func (r *Room) ReleaseShadowed(ctx context.Context, saleID, userID int64) error {
	n, err := releaseScript.Run(ctx, r.rdb, saleKeys(saleID, keyShadow, keyShadowN, keyReleased), userID).Int()
	if err != nil {
		return fmt.Errorf("waitroom.ReleaseShadowed: %w", err)
	}
	if n == 0 {
		return flashsale.Errorf(flashsale.CodeNotFound, "user %d is not in this sale's shadow queue", userID)
	}
	return nil
}

// shadowTicket reads the ticket shown to a shadowed user (ok false: not
// shadowed).
func (r *Room) shadowTicket(ctx context.Context, saleID, userID int64) (int64, bool, error) {
	v, err := r.rdb.HGet(ctx, lua.QueueKey(saleID, keyShadow), strconv.FormatInt(userID, 10)).Result()
	return shadowTicketOf(v, err)
}

// shadowTicketOf is shadowTicket's answer from the shadow hash's reply
// for the user (v, err).
func shadowTicketOf(v string, err error) (int64, bool, error) {
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("waitroom: read shadow: %w", err)
	}
	rec, ok := parseShadowRecord(v)
	if !ok {
		return 0, false, fmt.Errorf("waitroom: shadow record %q", v)
	}
	return rec.ticket, true, nil
}
