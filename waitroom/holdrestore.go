package waitroom

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// Holds after a Redis loss (queue order).
//
// Holds live in Redis only. When Redis loses a sale's stock (an empty
// restart, or a failover after which the reconciler drops the stock and
// buyer records), the holds are gone with it, while the admission records
// of the holders come back (restore.go: from the gateways' connections)
// or were never lost. So the holds are rebuilt: every leader tick that
// finds the stock unknown marks the queue state (fieldHoldsLost); at the
// first tick with the stock rebuilt (from the database's orders and the
// orders in flight, buyer records included) the leader, before granting
// any new place, holds a unit again for each admitted place whose window
// is still open, in place order, until the end of that same window (the
// item held before when Redis still knows it, else the first with a unit
// free). A shopper who bought before the loss has a buyer record again:
// the hold is refused (ALREADY_PURCHASED) and it gets nothing more, so
// nobody holds two units. A shopper for whom no unit is left has its
// admission ended (its record's window closed): its gateway sends it back
// in line (WAITING, or SOLD_OUT), as for a hold that lapsed. The rebuilt
// holds and the ended admissions are written in one script with the
// holds generation (fieldHoldsGen), so that the gateways tell their
// shoppers.
//
// A holder no gateway held a connection of at the loss (a polling one)
// has no admission record after an empty restart: its hold is not
// rebuilt.

// fieldHoldsLost marks a queue sale whose holds may have been lost with
// the stock: set while the leader finds the stock unknown, cleared once
// the holds are rebuilt.
const fieldHoldsLost = "holdslost"

// markHoldsLost is the leader's tick of a queue sale whose stock is
// unknown (Redis lost it; the reconciler rebuilds it).
func (r *Room) markHoldsLost(ctx context.Context, sale *flashsale.Sale) {
	if err := r.rdb.HSet(ctx, lua.QueueKey(sale.ID, keyState), fieldHoldsLost, 1).Err(); err != nil && ctx.Err() == nil {
		r.log.Warn("mark holds lost", "sale", sale.ID, "err", err)
	}
}

// rebuiltHold is one admitted place looked at by reholdLost.
type rebuiltHold struct {
	user, place, atMs int64
	item              int64 // held again (0: none)
	ended             bool  // no unit left: the admission ends
}

// reholdLost rebuilds the holds of the admitted places after a loss (see
// above), with the stock rem read this tick. It reports whether it ran,
// in which case the tick grants no new place (the next one does, with
// the stock read again).
func (r *Room) reholdLost(ctx context.Context, sale *flashsale.Sale, rem map[int64]int64, now time.Time) (bool, error) {
	state := lua.QueueKey(sale.ID, keyState)
	if err := r.rdb.HGet(ctx, state, fieldHoldsLost).Err(); errors.Is(err, redis.Nil) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("waitroom.reholdLost: %w", err)
	}
	recs, err := r.rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyAdmitted)).Result()
	if err != nil {
		return true, fmt.Errorf("waitroom.reholdLost: %w", err)
	}
	window := sale.Window().Milliseconds()
	var open []rebuiltHold
	for u, rec := range recs {
		user, err1 := strconv.ParseInt(u, 10, 64)
		place, at, ok := strings.Cut(rec, "|")
		p, err2 := strconv.ParseInt(place, 10, 64)
		a, err3 := strconv.ParseInt(at, 10, 64)
		if !ok || err1 != nil || err2 != nil || err3 != nil || a+window <= now.UnixMilli() {
			continue
		}
		open = append(open, rebuiltHold{user: user, place: p, atMs: a})
	}
	slices.SortFunc(open, func(a, b rebuiltHold) int { return cmp.Compare(a.place, b.place) })
	users := make([]int64, len(open))
	for i, h := range open {
		users[i] = h.user
	}
	before, err := readHeldItems(ctx, r.rdb, sale.ID, users)
	if err != nil {
		return true, fmt.Errorf("waitroom.reholdLost: %w", err)
	}
	left := make(map[int64]int64, len(sale.Items))
	for _, it := range sale.Items {
		left[it.ID] = rem[it.ID]
	}
	reheld, ended := 0, 0
	for i := range open {
		h := &open[i]
		until := time.UnixMilli(h.atMs + window)
		item, short, err := r.rehold(ctx, sale, h.user, before[i], left, until)
		if err != nil {
			return true, err // the rest at the next tick: nothing is written before
		}
		h.item, h.ended = item, short
		if item != 0 {
			reheld++
		}
		if short {
			ended++
		}
	}
	args := make([]any, 0, 1+3*len(open))
	args = append(args, r.id)
	for _, h := range open {
		switch {
		case h.ended:
			// A window that ends now: the gateways send the shopper back.
			args = append(args, h.user, 0, strconv.FormatInt(h.place, 10)+"|"+strconv.FormatInt(now.UnixMilli()-window, 10))
		case h.item != 0:
			args = append(args, h.user, h.item, "")
		}
	}
	n, err := reholdScript.Run(ctx, r.rdb, saleKeys(sale.ID, keyState, keyLease, keyAdmitted, keyHeldItem), args...).Int()
	if err != nil {
		return true, fmt.Errorf("waitroom.reholdLost: %w", err)
	}
	if n == 1 {
		r.log.Warn("holds rebuilt after Redis lost them", "sale", sale.ID, "admitted", len(open), "reheld", reheld, "ended", ended)
	}
	return true, nil
}

// rehold holds a unit for user u until until, of item prefer when it has
// one left, else of the first item with one. It returns the item held
// (0 when the user bought before, or holds a unit already: nothing more
// to give) or short when no unit is left; an error leaves the user for
// the next tick. Hold is asked at least once, even when the stock read
// says no unit is left: it looks at the user's buyer record before the
// stock, so a user who bought or holds is never taken for one short.
func (r *Room) rehold(ctx context.Context, sale *flashsale.Sale, u, prefer int64, left map[int64]int64, until time.Time) (item int64, short bool, err error) {
	asked := false
	for {
		item = 0
		if left[prefer] > 0 {
			item = prefer
		} else {
			for _, it := range sale.Items {
				if left[it.ID] > 0 {
					item = it.ID
					break
				}
			}
		}
		switch {
		case item == 0 && asked:
			return 0, true, nil
		case item == 0 && prefer != 0:
			item = prefer
		case item == 0 && len(sale.Items) > 0:
			item = sale.Items[0].ID
		case item == 0:
			return 0, true, nil
		}
		asked = true
		id, err := uuid.NewV7()
		if err != nil {
			return 0, false, fmt.Errorf("waitroom.rehold: %w", err)
		}
		err = r.cfg.Holds.Hold(ctx, sale.ID, item, u, id.String(), until)
		switch flashsale.ErrorCode(err) {
		case "":
			left[item]--
			return item, false, nil
		case flashsale.CodeSoldOut:
			left[item] = 0
			continue
		case flashsale.CodeAlreadyPurchased:
			// Bought before the loss (the rebuilt buyer record), or held
			// already (a pass cut short, or holds never lost).
			held, _, ok, err := r.cfg.Holds.Held(ctx, sale.ID, u)
			if err != nil {
				return 0, false, fmt.Errorf("waitroom.rehold: %w", err)
			}
			if ok {
				return held, false, nil
			}
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("waitroom.rehold: %w", err)
	}
}

// reholdScript writes what reholdLost did, only for the lease's holder:
// the items held again, the admissions ended; it clears fieldHoldsLost and
// bumps the holds generation.
//
//	KEYS: state, lease, admitted, helditem
//	ARGV: me, then per user: userId, itemId (0: admission ended), the
//	      ended admission's record ("" when held)
//	returns 1 written, 0 not (lease lost)
var reholdScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
for i = 2, #ARGV, 3 do
  if ARGV[i + 1] ~= '0' then
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  else
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 2])
    redis.call('HDEL', KEYS[4], ARGV[i])
  end
end
redis.call('HDEL', KEYS[1], '` + fieldHoldsLost + `')
redis.call('HINCRBY', KEYS[1], '` + fieldHoldsGen + `', 1)
return 1
`)
