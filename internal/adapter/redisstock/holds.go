package redisstock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// Holds: a sale allocated in queue order gives each shopper, at their
// turn, one unit held for a claim window. A hold is a reservation made on
// the shopper's behalf by the reserve scripts themselves (one per user per
// sale, the unit taken atomically, borrowed from another shard when the
// home shard is dry), marked by a member of the home shard's holds ZSET
// scored by the end of the window. Its buyer record and pending member
// carry that end as their time, so the reconciler looks at an unclaimed
// hold only after the window plus its own bound: should nobody lapse it
// (no leader in the waiting room), the reconciler gives its unit back
// then, as for any reservation that never reached Kafka (with a REJECTED
// row).
//
// Two scripts settle a hold, each atomic on the home shard: a claim
// (lua.HoldClaim, the holder's purchase) turns it into an ordinary
// reservation made now, and a lapse (lua.HoldLapse) gives its unit back.
// Whichever removes the holds member first wins; the other finds no hold.
// Holds never exceed the stock, since each one took a unit.
//
// A Redis data loss takes the holds with it: the rebuild restores the
// stock from the database, where a hold never was, so its unit is back in
// stock; the waiting room's leader then holds units again for the
// admitted shoppers whose windows are open (waitroom/holdrestore.go). A
// pause extends the holds by its length (ExtendHolds, holdpause.go).

// Hold errors, beside the Reserve ones.
var (
	errNoHold    = &flashsale.Error{Code: flashsale.CodeNotAdmitted, Message: "no unit is held for you in this sale"}
	errHoldEnded = &flashsale.Error{Code: flashsale.CodeNotAdmitted, Message: "your claim window has ended; the unit held for you went to the next in line"}
)

// Hold takes one unit of itemID for userID under orderID, held until
// until: ALREADY_PURCHASED (with the order's id) when the user holds or
// bought a unit in the sale already, SOLD_OUT, NOT_FOUND (no stock record).
func (s *Store) Hold(ctx context.Context, saleID, itemID, userID int64, orderID string, until time.Time) error {
	if l := s.layout(saleID); l != nil {
		return s.reserveSharded(ctx, l, itemID, userID, orderID, until.UnixMilli(), true)
	}
	keys := append(reserveKeys(saleID), lua.HoldsKey(saleID))
	r := s.runScript(ctx, s.reserve, keys, itemID, userID, orderID, until.UnixMilli())
	if r.err != nil {
		return fmt.Errorf("redisstock.Hold: %w", r.err)
	}
	return s.replicated(reserveResult(r.res), r.wait)
}

// Claim turns userID's hold of itemID into a reservation made at now, if
// its window has not ended; it returns the order's id and the window's
// end (for Unclaim). Errors:
// ALREADY_PURCHASED with the order's id (claimed before); NOT_ADMITTED
// (no hold, or its window ended); INVALID naming the held item when the
// hold is of another item.
//
// While RunPipeline runs, claims share its pipelines with reservations: at
// a queue sale's opening every holder buys within a few seconds, and one
// round trip (and pooled connection) per claim queued them for seconds.
func (s *Store) Claim(ctx context.Context, saleID, itemID, userID int64, now time.Time) (string, time.Time, error) {
	return s.ClaimAs(ctx, 0, saleID, itemID, userID, now)
}

// ClaimAs is Claim made under the placement lease slot (lease.go; 0:
// none), recorded beside the reservation.
func (s *Store) ClaimAs(ctx context.Context, slot int, saleID, itemID, userID int64, now time.Time) (string, time.Time, error) {
	keys := s.holdKeys(saleID, userID)
	args := []any{userID, itemID, now.UnixMilli()}
	if slot > 0 {
		keys = append(keys, s.shardKey(saleID, userID, lua.KindOwners))
		args = append(args, slot)
	}
	var res []any
	var err error
	if taken, r := s.pipelinedArgs(ctx, s.claim, keys, args...); taken {
		res, err = r.res, r.err
	} else {
		res, err = s.claim.Run(ctx, s.rdb, keys, args...).Slice()
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("redisstock.Claim: %w", err)
	}
	if len(res) < 2 {
		return "", time.Time{}, fmt.Errorf("redisstock.Claim: %w: %v", errBadReply, res)
	}
	code, _ := res[0].(int64)
	val, _ := res[1].(string)
	switch code {
	case lua.ResultOK:
		if len(res) != 3 {
			break
		}
		ms, err := strconv.ParseInt(fmt.Sprint(res[2]), 10, 64)
		if err != nil {
			break
		}
		return val, time.UnixMilli(ms), nil
	case lua.ResultAlready:
		return "", time.Time{}, &flashsale.Error{Code: flashsale.CodeAlreadyPurchased, Message: "you already hold an order in this sale", OrderID: val}
	case lua.ResultNoHold:
		return "", time.Time{}, errNoHold
	case lua.ResultLapsed:
		return "", time.Time{}, errHoldEnded
	case lua.ResultOtherItem:
		return "", time.Time{}, flashsale.Invalid("itemId", "the unit held for you is item %s", val)
	}
	return "", time.Time{}, fmt.Errorf("redisstock.Claim: %w: %v", errBadReply, res)
}

// Unclaim makes the claimed orderID of userID a hold again until until
// (the end of the window Claim returned), when its order could not be
// published: the holder may try again within the window. It reports
// whether the hold is back.
func (s *Store) Unclaim(ctx context.Context, saleID, userID int64, orderID string, until time.Time) (bool, error) {
	n, err := s.unclaim.Run(ctx, s.rdb, s.holdKeys(saleID, userID), userID, orderID, until.UnixMilli()).Int64()
	if err != nil {
		return false, fmt.Errorf("redisstock.Unclaim: %w", err)
	}
	return n == 1, nil
}

// holdKeys are the keys of the claim scripts: the user's home shard's
// buyers, pending and holds.
func (s *Store) holdKeys(saleID, userID int64) []string {
	return []string{s.shardKey(saleID, userID, lua.KindBuyers), s.shardKey(saleID, userID, lua.KindPending),
		s.shardKey(saleID, userID, lua.KindHolds)}
}

// Lapsed is a hold whose window ended unclaimed; its unit is back.
type Lapsed struct {
	UserID, ItemID int64
	OrderID        string
}

// Lapse ends the holds of a sale whose window is over at now (every hold,
// with now at the end of time), at most limit per shard (≤ 0: 1,000), and
// gives their units back. It returns the holds it ended, in the order of
// their windows' ends per shard; an error leaves the rest for the next
// call (a unit owed to its donor shard is given back by Sweep).
func (s *Store) Lapse(ctx context.Context, saleID int64, now time.Time, limit int64) ([]Lapsed, error) {
	if limit <= 0 {
		limit = 1000
	}
	tags := s.tags(saleID)
	l := s.layout(saleID)
	max, nowArg := "+inf", endOfTime.UnixMilli()
	if now.Before(endOfTime) {
		max, nowArg = strconv.FormatInt(now.UnixMilli(), 10), now.UnixMilli()
	}
	var out []Lapsed
	for h := range tags {
		key := func(kind string) string { return lua.ShardKey(tags[h], kind) }
		users, err := s.rdb.ZRangeByScore(ctx, key(lua.KindHolds), &redis.ZRangeBy{Min: "-inf", Max: max, Count: limit}).Result()
		if err != nil {
			return out, fmt.Errorf("redisstock.Lapse: %w", err)
		}
		keys := []string{key(lua.KindStock), key(lua.KindBuyers), key(lua.KindPending), key(lua.KindReturning), key(lua.KindHolds)}
		for _, u := range users {
			user, err := strconv.ParseInt(u, 10, 64)
			if err != nil {
				continue
			}
			res, err := s.lapse.Run(ctx, s.rdb, keys, user, nowArg).Slice()
			if err != nil {
				return out, fmt.Errorf("redisstock.Lapse: %w", err)
			}
			code, _ := res[0].(int64)
			if code != lua.ResultReleased && code != lua.ResultOwed {
				continue
			}
			if len(res) < 3 {
				return out, fmt.Errorf("redisstock.Lapse: %w: %v", errBadReply, res)
			}
			order, _ := res[1].(string)
			item, err := strconv.ParseInt(fmt.Sprint(res[2]), 10, 64)
			if err != nil {
				return out, fmt.Errorf("redisstock.Lapse: %w: %v", errBadReply, res)
			}
			out = append(out, Lapsed{UserID: user, ItemID: item, OrderID: order})
			if code == lua.ResultOwed && l != nil && len(res) == 4 {
				d, err := strconv.Atoi(fmt.Sprint(res[3]))
				if err != nil || d < 0 || d >= l.shards {
					return out, fmt.Errorf("redisstock.Lapse: %w: donor %v", errBadReply, res[3])
				}
				if _, err := s.finishReturn(ctx, l, h, d, order, item); err != nil {
					return out, fmt.Errorf("redisstock.Lapse: %w", err)
				}
			}
		}
	}
	return out, nil
}

// endOfTime: Lapse with a time at or after it ends every hold (the sale
// ended).
var endOfTime = time.UnixMilli(1 << 52)

// EndOfTime is the time to give Lapse to end every hold of a sale.
func EndOfTime() time.Time { return endOfTime }

// HoldCount is the number of holds of a sale not yet claimed or lapsed.
func (s *Store) HoldCount(ctx context.Context, saleID int64) (int64, error) {
	var n int64
	for _, k := range s.kindKeys(saleID, lua.KindHolds) {
		c, err := s.rdb.ZCard(ctx, k).Result()
		if err != nil {
			return 0, fmt.Errorf("redisstock.HoldCount: %w", err)
		}
		n += c
	}
	return n, nil
}

// Held reports the item and the window's end of userID's hold in the
// sale, if the user holds one (not yet claimed or lapsed).
func (s *Store) Held(ctx context.Context, saleID, userID int64) (int64, time.Time, bool, error) {
	u := strconv.FormatInt(userID, 10)
	var score *redis.FloatCmd
	var rec *redis.StringCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		score = p.ZScore(ctx, s.shardKey(saleID, userID, lua.KindHolds), u)
		rec = p.HGet(ctx, s.shardKey(saleID, userID, lua.KindBuyers), u)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, time.Time{}, false, fmt.Errorf("redisstock.Held: %w", err)
	}
	until, serr := score.Result()
	v, rerr := rec.Result()
	if serr != nil || rerr != nil {
		return 0, time.Time{}, false, nil
	}
	b, ok := parseBuyer(v)
	if !ok {
		return 0, time.Time{}, false, nil
	}
	return b.ItemID, time.UnixMilli(int64(until)), true, nil
}
