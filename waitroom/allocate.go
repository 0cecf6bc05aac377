package waitroom

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// Allocation in queue order (flashsale.AllocationQueue).
//
// The sale's leader gives each shopper, at their turn, one unit held for
// the sale's claim window: the first wave at the draw (as many places as
// there are units, in drawn order), then, tick by tick, the next places in
// line while units are free. A hold is taken in the stock (Holds.Hold: the
// unit leaves the remaining stock, so holds never exceed it) before the
// place is admitted; the admission record (wr:{sN}:admitted) of a held
// place is written by the leader, with the time the window counts from
// (the grant, or the opening for the first wave), in the same script that
// moves the cursor past it, and never by the gateways. A gateway admits a
// shopper of a queue sale only on that record, so an admitted shopper
// always has a unit: the token's expiry is the window's end, and the
// purchase claims the held unit (purchase.Service.Claim).
//
// A hold not claimed within its window lapses at the leader's next tick
// (Holds.Lapse): its unit is back in stock, and the same tick holds it for
// the next place in line. The shopper whose hold lapsed goes to the back of
// the queue, as a race-mode shopper whose admission expired. While the
// sale is paused nothing lapses and nobody is admitted; when it ends every
// hold lapses. The rate and capacity cap of race mode do not apply.

// Holds is the stock side of allocation in queue order
// (*redisstock.Store, through the wiring).
type Holds interface {
	// Hold takes one unit of itemID for userID under orderID until
	// until; flashsale errors SOLD_OUT (no unit of the item),
	// ALREADY_PURCHASED (the user holds or bought one).
	Hold(ctx context.Context, saleID, itemID, userID int64, orderID string, until time.Time) error
	// Held reports the item and the end of the user's hold, if the user
	// holds one.
	Held(ctx context.Context, saleID, userID int64) (itemID int64, until time.Time, ok bool, err error)
	// Lapse ends the holds whose window is over at now (at most limit per
	// stock shard) and returns how many units went back.
	Lapse(ctx context.Context, saleID int64, now time.Time, limit int64) (int, error)
	// LapseAll ends every hold of the sale (it ended).
	LapseAll(ctx context.Context, saleID int64) (int, error)
	PauseHolds // holdpause.go
}

// maxHoldsPerTick bounds the holds one tick grants (the rest wait for the
// next tick): the first wave of a large sale takes a few ticks.
const maxHoldsPerTick = 2000

// allocState is what the leader of a queue sale keeps between ticks.
// Guarded by saleRoom.allocMu.
type allocState struct {
	// byPlace is the pre-queue by place: the user at each drawn place
	// (0: nobody), built once after the draw.
	byPlace []int64
	n       int64
	// servedTo is where this leader last moved the cursor: a pass that
	// read an older cursor starts there.
	servedTo int64
}

// windowStart is when the claim window of a hold granted at now counts
// from: the opening for the first wave (granted between the draw and the
// opening), the grant otherwise.
func windowStart(sale *flashsale.Sale, now time.Time) time.Time {
	if now.Before(sale.StartsAt) {
		return notBefore(sale, now.UnixMilli())
	}
	return now
}

// allocate is the leader's tick of a queue sale: it lapses the holds whose
// window is over, then holds a unit for each next place in line while
// units are free, and admits those places. rem is the stock as read this
// tick (every item has a record).
func (r *Room) allocate(ctx context.Context, sr *saleRoom, sale *flashsale.Sale, st queueState, rem map[int64]int64, now time.Time) error {
	if r.cfg.Holds == nil {
		return errors.New("waitroom.allocate: no Holds configured for a queue sale")
	}
	sr.allocMu.Lock()
	defer sr.allocMu.Unlock()
	if sale.Ended(now) {
		_, err := r.cfg.Holds.LapseAll(ctx, sale.ID)
		return err
	}
	if err := r.pauseHolds(ctx, sale, now); err != nil {
		return err // nothing lapses before the pause's extension
	}
	if sale.Paused || st.N < 0 {
		return nil
	}
	back, err := r.cfg.Holds.Lapse(ctx, sale.ID, now, 1000)
	if err != nil {
		return fmt.Errorf("waitroom.allocate: %w", err)
	}
	if back > 0 {
		// Units came back: read the stock again, so they go to the next
		// in line this very tick.
		if rem, err = r.stock.Remaining(ctx, sale.ID); err != nil {
			return fmt.Errorf("waitroom.allocate: %w", err)
		}
	}
	if again, err := r.reholdLost(ctx, sale, rem, now); again || err != nil {
		return err // holds lost with Redis first (holdrestore.go)
	}
	free := int64(0)
	for _, it := range sale.Items {
		free += max(rem[it.ID], 0)
	}
	if sr.alloc != nil && sr.alloc.servedTo > st.Serving {
		st.Serving = sr.alloc.servedTo
	}
	k := min(free, st.Seq-st.Serving, maxHoldsPerTick)
	if k <= 0 {
		return nil
	}
	users, err := r.placeUsers(ctx, sr, sale, st, st.Serving, k)
	if err != nil {
		return err
	}
	start := windowStart(sale, now)
	until := start.Add(sale.Window())
	left := make(map[int64]int64, len(sale.Items))
	for _, it := range sale.Items {
		left[it.ID] = rem[it.ID]
	}
	var admits []heldAdmit
	passed := int64(0)
	for i, u := range users {
		if u != 0 {
			at, item, ok := r.holdFor(ctx, sale, u, left, start, until)
			if !ok {
				break // no unit, or Redis failed: the place waits for the next tick
			}
			if at != 0 {
				admits = append(admits, heldAdmit{user: u, place: st.Serving + int64(i), atMs: at, item: item})
			}
		}
		passed++
	}
	if passed == 0 {
		return nil
	}
	moved, err := admitHeld(ctx, r.rdb, sale.ID, r.id, st.Serving, st.Serving+passed, admits)
	if moved {
		sr.alloc.servedTo = st.Serving + passed
	}
	return err
}

// holdFor holds a unit for user u (of the first item with a unit left),
// until until. It returns the admission time of the hold (0: the user
// bought before and has nothing more to be given), its item and ok, or ok
// false when no unit is left or Redis failed.
func (r *Room) holdFor(ctx context.Context, sale *flashsale.Sale, u int64, left map[int64]int64, start, until time.Time) (int64, int64, bool) {
	for {
		item := firstWithStock(sale, left)
		if item == 0 {
			return 0, 0, false
		}
		id, err := uuid.NewV7()
		if err != nil {
			r.log.Warn("hold a unit: order id", "sale", sale.ID, "err", err)
			return 0, 0, false
		}
		err = r.cfg.Holds.Hold(ctx, sale.ID, item, u, id.String(), until)
		switch flashsale.ErrorCode(err) {
		case "":
			left[item]--
			return start.UnixMilli(), item, true
		case flashsale.CodeSoldOut:
			// The stock read this tick was older than the hold: try
			// the next item.
			left[item] = 0
			continue
		case flashsale.CodeAlreadyPurchased:
			// A hold taken by a leader cut short before it admitted the
			// place (admitted now, in that hold's window), or a unit
			// bought before.
			heldItem, end, held, err := r.cfg.Holds.Held(ctx, sale.ID, u)
			if err != nil {
				r.log.Warn("read a hold", "sale", sale.ID, "user", u, "err", err)
				return 0, 0, false
			}
			if !held {
				return 0, 0, true
			}
			return end.Add(-sale.Window()).UnixMilli(), heldItem, true
		}
		r.log.Warn("hold a unit", "sale", sale.ID, "user", u, "err", err)
		return 0, 0, false
	}
}

// firstWithStock is the first of the sale's items with a unit left (0:
// none). Until shoppers choose an item, a hold is of the first item in
// the sale's order that has one.
func firstWithStock(sale *flashsale.Sale, left map[int64]int64) int64 {
	for _, it := range sale.Items {
		if left[it.ID] > 0 {
			return it.ID
		}
	}
	return 0
}

// placeUsers returns the users at places from..from+k-1 (0: nobody):
// drawn places from the pre-queue (read once per sale and leader), later
// places by ticket.
func (r *Room) placeUsers(ctx context.Context, sr *saleRoom, sale *flashsale.Sale, st queueState, from, k int64) ([]int64, error) {
	if sr.alloc == nil || sr.alloc.n != st.N {
		a := &allocState{n: st.N}
		if st.N > 0 {
			ids, err := r.rdb.LRange(ctx, lua.QueueKey(sale.ID, keyOrder), 0, st.N-1).Result()
			if err != nil {
				return nil, fmt.Errorf("waitroom.placeUsers: %w", err)
			}
			if int64(len(ids)) != st.N {
				return nil, fmt.Errorf("waitroom.placeUsers: sale %d: %d of %d pre-queue tickets in Redis", sale.ID, len(ids), st.N)
			}
			perm := NewPermuter(sale.ShuffleSeed, uint64(st.N))
			a.byPlace = make([]int64, st.N)
			for t, s := range ids {
				u, _ := strconv.ParseInt(s, 10, 64)
				a.byPlace[perm.Place(uint64(t))] = u
			}
		}
		sr.alloc = a
	}
	out := make([]int64, 0, k)
	for p := from; p < from+k && p < st.N; p++ {
		out = append(out, sr.alloc.byPlace[p])
	}
	if rest := from + k - max(from, st.N); rest > 0 {
		ids, err := r.rdb.LRange(ctx, lua.QueueKey(sale.ID, keyOrder), max(from, st.N), from+k-1).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("waitroom.placeUsers: %w", err)
		}
		for _, s := range ids {
			u, _ := strconv.ParseInt(s, 10, 64)
			out = append(out, u)
		}
	}
	return out, nil
}

// heldAdmit is the admission record the leader writes for a held place.
type heldAdmit struct {
	user, place, atMs, item int64
}

// admitHeldScript admits held places: it moves the cursor from..to and
// writes the admission records (and held items) of the places that hold a
// unit, only for the lease's holder and only from the cursor it read (a
// leader that lost the lease, or a second look at the same places, changes
// nothing).
//
//	KEYS: state, lease, admitted, helditem
//	ARGV: me, from, to, userId, "place|atMs", itemId, ...
//	returns 1 moved, 0 not (lease or cursor changed)
var admitHeldScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'serving') or '0') ~= tonumber(ARGV[2]) then return 0 end
for i = 4, #ARGV, 3 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 2])
end
redis.call('HSET', KEYS[1], 'serving', ARGV[3])
return 1
`)

// admitHeld runs admitHeldScript; moved reports whether it moved the
// cursor.
func admitHeld(ctx context.Context, rdb redis.UniversalClient, saleID int64, me string, from, to int64, admits []heldAdmit) (moved bool, err error) {
	args := make([]any, 0, 3+3*len(admits))
	args = append(args, me, from, to)
	for _, a := range admits {
		args = append(args, a.user, strconv.FormatInt(a.place, 10)+"|"+strconv.FormatInt(a.atMs, 10), a.item)
	}
	n, err := admitHeldScript.Run(ctx, rdb, saleKeys(saleID, keyState, keyLease, keyAdmitted, keyHeldItem), args...).Int()
	if err != nil {
		return false, fmt.Errorf("waitroom.admitHeld: %w", err)
	}
	return n == 1, nil
}

// readHeldItems returns the item held for each user of a queue sale (0:
// none known).
func readHeldItems(ctx context.Context, rdb redis.UniversalClient, saleID int64, users []int64) ([]int64, error) {
	fields := make([]string, len(users))
	for i, u := range users {
		fields[i] = strconv.FormatInt(u, 10)
	}
	vals, err := rdb.HMGet(ctx, lua.QueueKey(saleID, keyHeldItem), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("waitroom.readHeldItems: %w", err)
	}
	out := make([]int64, len(users))
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[i], _ = strconv.ParseInt(s, 10, 64)
		}
	}
	return out, nil
}
