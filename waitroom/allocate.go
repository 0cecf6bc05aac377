package waitroom

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	// HoldMany takes the holds of reqs, all until until, in order, in one
	// round trip where it can, and answers each as Hold would; err fails
	// the whole call (some holds may have been taken all the same).
	HoldMany(ctx context.Context, saleID int64, reqs []HoldReq, until time.Time) ([]error, error)
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

// HoldReq is one hold of Holds.HoldMany.
type HoldReq struct {
	ItemID, UserID int64
	OrderID        string
}

// maxHoldsPerTick bounds the places one tick serves (the rest wait for
// the next tick). The first wave of a 10,000-unit sale is one tick: its
// holds go in one HoldMany and its admissions in one script, about a
// tenth of a second on one Redis, so the admitted messages and the
// SOLD_OUT of everyone else go out at the draw, seconds before the
// purchases. At 2,000 a tick the full drop's first wave took five ticks
// and its last pushes met the opening's purchases (purchase p50 3.2 s).
const maxHoldsPerTick = 10_000

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
// opening), the grant otherwise. notBefore decides in milliseconds, as
// the admission record and the token do: a grant within the opening's own
// millisecond but before its instant has no not-before, and its window
// counts from the grant (it was the zero time, a record of year 1 that
// every gateway took for an admission long expired).
func windowStart(sale *flashsale.Sale, now time.Time) time.Time {
	if nb := notBefore(sale, now.UnixMilli()); !nb.IsZero() {
		return nb
	}
	return now
}

// allocate is the leader's tick of a queue sale: it lapses the holds whose
// window is over, then holds a unit for each next place in line while
// units are free, and admits those places. rem is the stock as the tick
// read it (every item has a record), returned when the pass does not run;
// the pass reads it again once it has the sale's allocation lock.
// allocate returns the stock after its
// holds and the cursor after its pass, so that this very tick admits the
// held places and shows the items it sold out (a shopper passed over for
// one is told at once).
func (r *Room) allocate(ctx context.Context, sr *saleRoom, sale *flashsale.Sale, st queueState, rem map[int64]int64, now time.Time) (map[int64]int64, int64, error) {
	if r.cfg.Holds == nil {
		return rem, st.Serving, errors.New("waitroom.allocate: no Holds configured for a queue sale")
	}
	sr.allocMu.Lock()
	defer sr.allocMu.Unlock()
	if sale.Ended(now) {
		_, err := r.cfg.Holds.LapseAll(ctx, sale.ID)
		return rem, st.Serving, err
	}
	if err := r.pauseHolds(ctx, sale, now); err != nil {
		return rem, st.Serving, err // nothing lapses before the pause's extension
	}
	if sale.Paused || st.N < 0 {
		return rem, st.Serving, nil
	}
	if _, err := r.cfg.Holds.Lapse(ctx, sale.ID, now, 1000); err != nil {
		return rem, st.Serving, fmt.Errorf("waitroom.allocate: %w", err)
	}
	// The stock as it is now, under allocMu: units that came back go to
	// the next in line this very tick, and a pass of the other loop
	// (advanceLoop's refresh or the tick's) may have held units since the
	// caller read it. A pass on the older count looked at the places
	// after the first wave for units already gone, at the draw, and
	// passed over those who had chosen an item.
	again, err := r.stock.Remaining(ctx, sale.ID)
	if err != nil {
		return rem, st.Serving, fmt.Errorf("waitroom.allocate: %w", err)
	}
	for _, it := range sale.Items {
		if _, ok := again[it.ID]; !ok {
			return rem, st.Serving, nil // the stock is lost: the reconciler rebuilds it
		}
	}
	rem = again
	if again, err := r.reholdLost(ctx, sale, rem, now); again || err != nil {
		return rem, st.Serving, err // holds lost with Redis first (holdrestore.go)
	}
	if sr.alloc != nil && sr.alloc.servedTo > st.Serving {
		st.Serving = sr.alloc.servedTo
	}
	left := make(map[int64]int64, len(sale.Items))
	for _, it := range sale.Items {
		left[it.ID] = max(rem[it.ID], 0)
	}
	holding, err := readHolding(ctx, r.rdb, sale.ID)
	if err != nil {
		return rem, st.Serving, err
	}
	if freeUnits(left) == 0 && holding <= st.Serving {
		return rem, st.Serving, nil
	}
	p := pass{start: windowStart(sale, now), left: left, budget: maxHoldsPerTick, fixUntil: now.Add(fixFor).UnixMilli(), holdingTo: holding, marked: holding}
	p.until = p.start.Add(sale.Window())
	// Places passed over for want of their chosen item come first, so a
	// unit goes to the earliest place that wants it.
	if err := r.servePassed(ctx, sale, &p); err != nil {
		return rem, st.Serving, err
	}
	to, err := r.serveNew(ctx, sr, sale, st, &p)
	if err != nil {
		r.log.Warn("allocate held units", "sale", sale.ID, "err", err)
	}
	if to == st.Serving && len(p.admits) == 0 && len(p.fixed) == 0 {
		return rem, st.Serving, nil
	}
	moved, err := admitHeld(ctx, r.rdb, sale.ID, r.id, st.Serving, to, &p)
	if !moved {
		return rem, st.Serving, err
	}
	r.notifyHeld(sale.ID, p.admits)
	// The report counts the same turns: the places whose admission record
	// this pass wrote, once, for the lease's holder.
	var holds int64
	for _, a := range p.admits {
		if a.atMs != 0 {
			holds++
		}
	}
	r.tally.held(sale.ID, now, holds)
	if to > st.Serving {
		sr.alloc.servedTo = to
	}
	after := make(map[int64]int64, len(rem))
	for id, n := range rem {
		after[id] = n
		if l, ok := p.left[id]; ok && l < n {
			after[id] = l
		}
	}
	return after, to, err
}

// fixFor is how long a leader's fix of the choices it reads lasts at most
// (fixChoicesScript): its pass lifts it sooner; a leader cut short in a
// pass leaves it to run out.
const fixFor = 5 * time.Second

// maxChoiceRounds bounds the reads of new places one tick makes: each
// round reads as many places as units are free, and places passed over
// for their chosen item leave the units for the next round.
const maxChoiceRounds = 16

// pass is one allocation pass of the leader.
type pass struct {
	start, until time.Time
	left         map[int64]int64 // free units by item, as the pass holds them
	budget       int64           // places the pass may still look at
	fixUntil     int64           // ms: end of the fix of the choices read
	admits       []heldAdmit
	passes       []heldAdmit // new places passed over (user, place)
	fixed        []int64     // users whose choice the pass fixed
	// holdingTo is the place before which an earlier pass may have taken
	// holds it never admitted (markHolding, read at the pass's start):
	// those places are served from their holds first, whatever the free
	// units. marked is the mark as this pass has left it.
	holdingTo, marked int64
}

func freeUnits(left map[int64]int64) int64 {
	n := int64(0)
	for _, v := range left {
		n += max(v, 0)
	}
	return n
}

// servePassed holds units for passed places whose chosen item has units
// free, in place order.
func (r *Room) servePassed(ctx context.Context, sale *flashsale.Sale, p *pass) error {
	type cand struct{ user, place int64 }
	var cands []cand
	for _, it := range sale.Items {
		if p.left[it.ID] <= 0 || p.budget <= 0 {
			continue
		}
		us, ps, err := passedWanting(ctx, r.rdb, sale.ID, it.ID, min(p.left[it.ID], p.budget))
		if err != nil {
			return fmt.Errorf("waitroom.allocate: %w", err)
		}
		for i := range us {
			cands = append(cands, cand{us[i], ps[i]})
		}
		p.budget -= int64(len(us))
	}
	if len(cands) == 0 {
		return nil
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(a.place, b.place) })
	users := make([]int64, len(cands))
	for i, c := range cands {
		users[i] = c.user
	}
	choices, err := fixChoices(ctx, r.rdb, sale.ID, r.id, p.fixUntil, users)
	if err != nil {
		return fmt.Errorf("waitroom.allocate: %w", err)
	}
	p.fixed = append(p.fixed, users...)
	for i, c := range cands {
		at, item, res := r.holdFor(ctx, sale, c.user, choices[i], p)
		switch res {
		case holdStop:
			return nil
		case holdDone:
			// at 0: a unit bought before; the place leaves the lists
			// with nothing written, so it cannot take a unit's turn.
			p.admits = append(p.admits, heldAdmit{user: c.user, place: c.place, atMs: at, item: item, passed: true})
		}
	}
	return nil
}

// serveNew looks at the places from the cursor on while units are free,
// holds a unit for each whose chosen item (or, with no choice, any item)
// has one, and passes over those whose chosen item has none. It returns
// where the cursor goes.
func (r *Room) serveNew(ctx context.Context, sr *saleRoom, sale *flashsale.Sale, st queueState, p *pass) (int64, error) {
	pos := st.Serving
	for range maxChoiceRounds {
		k := min(freeUnits(p.left)+max(p.holdingTo-pos, 0), st.Seq-pos, p.budget)
		if k <= 0 {
			break
		}
		users, err := r.placeUsers(ctx, sr, sale, st, pos, k)
		if err != nil {
			return pos, err
		}
		if freeUnits(p.left) == 0 {
			// No unit free: the places below the mark are served from
			// the holds an earlier pass took, or wait. Nothing is chosen
			// for them, so no choice is fixed: a sold-out sale whose mark
			// stood past the cursor fixed and lifted thousands of choices
			// every tick.
			var waits bool
			if pos, waits, err = r.serveHeld(ctx, sale, users, pos, p); waits || err != nil {
				return pos, err
			}
			continue
		}
		if to := pos + int64(len(users)); to > p.marked {
			// Before any hold of these places: a leader cut short
			// between its holds and its admissions leaves the mark, and
			// the next pass serves the places from their holds.
			if ok, err := markHolding(ctx, r.rdb, sale.ID, r.id, to); err != nil || !ok {
				return pos, err
			}
			p.marked = to
		}
		var present []int64
		for _, u := range users {
			if u != 0 {
				present = append(present, u)
			}
		}
		var choices []int64
		if len(present) > 0 {
			if choices, err = fixChoices(ctx, r.rdb, sale.ID, r.id, p.fixUntil, present); err != nil {
				return pos, err
			}
			p.fixed = append(p.fixed, present...)
		}
		tried := r.holdAhead(ctx, sale, present, choices, p)
		j := 0
		for _, u := range users {
			if u == 0 {
				pos++
				continue
			}
			choice := choices[j]
			var at, item int64
			var res holdResult
			if t := tried[j]; t.done {
				at, item, res = t.at, t.item, holdDone
			} else if a, it, ok, err := r.heldBefore(ctx, sale, u, pos, p); err != nil {
				return pos, err
			} else if ok {
				at, item, res = a, it, holdDone
			} else if pos < p.holdingTo && freeUnits(p.left) == 0 {
				// Below the mark but holding nothing, with no unit free:
				// the place waits, as it would with no mark (it is not
				// passed over while every unit is held).
				return pos, nil
			} else {
				at, item, res = r.holdFor(ctx, sale, u, choice, p)
			}
			j++
			switch res {
			case holdStop:
				return pos, nil // no unit, or Redis failed: the place waits for the next tick
			case holdDone:
				if at != 0 {
					p.admits = append(p.admits, heldAdmit{user: u, place: pos, atMs: at, item: item})
				}
			case holdWantsOut:
				p.passes = append(p.passes, heldAdmit{user: u, place: pos})
			}
			pos++
		}
		p.budget -= int64(len(users))
	}
	return pos, nil
}

// serveHeld serves users, the places from pos on (all below the mark),
// from the holds an earlier pass took for them, in place order, until
// the first place that holds nothing: it waits (waits true), as it would
// with no mark. It returns where the cursor goes.
func (r *Room) serveHeld(ctx context.Context, sale *flashsale.Sale, users []int64, pos int64, p *pass) (int64, bool, error) {
	for _, u := range users {
		if u == 0 {
			pos++
			continue
		}
		at, item, ok, err := r.heldBefore(ctx, sale, u, pos, p)
		if err != nil || !ok {
			return pos, true, err
		}
		if at != 0 {
			p.admits = append(p.admits, heldAdmit{user: u, place: pos, atMs: at, item: item})
		}
		pos++
	}
	p.budget -= int64(len(users))
	return pos, false, nil
}

// heldAhead is what holdAhead did for a place: done with the admission
// time and item of its hold, or not (holdFor decides the place).
type heldAhead struct {
	done     bool
	at, item int64
}

// holdAhead holds, in one HoldMany, a unit for each of users (in place
// order) whose item is known from p.left: the chosen one when it has a
// unit free, else, with no choice, the first item with one. It plans
// until the first place it cannot plan (a sold-out choice, no unit at
// all), and reports done for each place whose hold was taken; every other
// place goes to holdFor, one by one, as before, in order. The first wave
// of a large sale is thousands of holds at the draw: one round trip a
// tick instead of one a place.
func (r *Room) holdAhead(ctx context.Context, sale *flashsale.Sale, users, choices []int64, p *pass) []heldAhead {
	out := make([]heldAhead, len(users))
	left := maps.Clone(p.left)
	var reqs []HoldReq
	for i, u := range users {
		item := choices[i]
		if item == 0 {
			item = firstWithStock(sale, left)
		}
		if item == 0 || left[item] <= 0 {
			break
		}
		id, err := uuid.NewV7()
		if err != nil {
			break
		}
		left[item]--
		reqs = append(reqs, HoldReq{ItemID: item, UserID: u, OrderID: id.String()})
	}
	if len(reqs) < 2 {
		return out // nothing to gain over holdFor
	}
	answers, err := r.cfg.Holds.HoldMany(ctx, sale.ID, reqs, p.until)
	if err != nil || len(answers) != len(reqs) {
		// Whatever was taken, holdFor finds as the user's own hold
		// (ALREADY_PURCHASED), place by place.
		r.log.Warn("hold units", "sale", sale.ID, "holds", len(reqs), "err", err)
		return out
	}
	for i, a := range answers {
		if a != nil {
			// From the first place not held on, holdFor decides, in
			// order (it finds a hold taken here as the user's own).
			break
		}
		p.left[reqs[i].ItemID]--
		out[i] = heldAhead{done: true, at: p.start.UnixMilli(), item: reqs[i].ItemID}
	}
	return out
}

// holdResult is what holdFor did for a place.
type holdResult int

const (
	// holdDone: a unit is held (or the user bought before: nothing to
	// give); the place is served.
	holdDone holdResult = iota
	// holdWantsOut: the chosen item has no unit free; the place is
	// passed over and keeps its turn for that item.
	holdWantsOut
	// holdStop: no unit of any item, or Redis failed; the place waits.
	holdStop
)

// holdFor holds a unit for user u, until p.until: of the chosen item, or,
// with no choice (0), of the first item with a unit left. It returns the
// admission time of the hold (0: the user bought before and has nothing
// more to be given) and its item with holdDone.
func (r *Room) holdFor(ctx context.Context, sale *flashsale.Sale, u, choice int64, p *pass) (int64, int64, holdResult) {
	for {
		item := choice
		if item == 0 {
			if item = firstWithStock(sale, p.left); item == 0 {
				return 0, 0, holdStop
			}
		} else if p.left[item] <= 0 {
			return 0, 0, holdWantsOut
		}
		id, err := uuid.NewV7()
		if err != nil {
			r.log.Warn("hold a unit: order id", "sale", sale.ID, "err", err)
			return 0, 0, holdStop
		}
		err = r.cfg.Holds.Hold(ctx, sale.ID, item, u, id.String(), p.until)
		switch flashsale.ErrorCode(err) {
		case "":
			p.left[item]--
			return p.start.UnixMilli(), item, holdDone
		case flashsale.CodeSoldOut:
			// The stock read this tick was older than the hold: try
			// again without the item.
			p.left[item] = 0
			continue
		case flashsale.CodeAlreadyPurchased:
			// A hold taken by a leader cut short before it admitted the
			// place (admitted now, in that hold's window), or a unit
			// bought before.
			heldItem, end, held, err := r.cfg.Holds.Held(ctx, sale.ID, u)
			if err != nil {
				r.log.Warn("read a hold", "sale", sale.ID, "user", u, "err", err)
				return 0, 0, holdStop
			}
			if !held {
				return 0, 0, holdDone
			}
			return end.Add(-sale.Window()).UnixMilli(), heldItem, holdDone
		}
		r.log.Warn("hold a unit", "sale", sale.ID, "user", u, "err", err)
		return 0, 0, holdStop
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
			q, err := readDrawn(ctx, r.rdb, sale.ID)
			if err != nil {
				return nil, fmt.Errorf("waitroom.placeUsers: %w", err)
			}
			if q.n != st.N || int64(len(q.users)) != st.N {
				return nil, fmt.Errorf("waitroom.placeUsers: sale %d: %d of %d pre-queue tickets in Redis", sale.ID, len(q.users), st.N)
			}
			d := q.draw(sale.ShuffleSeed)
			a.byPlace = make([]int64, st.N)
			for t, u := range q.users {
				a.byPlace[d.Place(uint64(t))] = u
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

// heldAdmit is the admission record the leader writes for a held place
// (passed: the place had been passed over), or a place it passes over.
type heldAdmit struct {
	user, place, atMs, item int64
	passed                  bool
}

// admitHeldScript ends an allocation pass: it moves the cursor from..to,
// sets the holding mark (fieldHolding) to the larger of to and the mark
// the pass began with (every hold of the pass is of a place before to and
// admitted here; a mark an earlier leader left past to still stands),
// writes the admission records (and held items) of the places that hold a
// unit, takes the passed places it admits off the passed lists, lists the
// new places passed over under their chosen item, and lifts the fix of
// every choice the pass read; only for the lease's holder and only from
// the cursor it read (a leader that lost the lease, or a second look at
// the same places, changes nothing).
//
//	KEYS: state, lease, admitted, helditem, choice, fixed, passed, wants
//	ARGV: me, from, to, A, P, F, then A × (userId, "place|atMs" or ""
//	      for a passed place with nothing to give, itemId, passed 0/1),
//	      P × (userId, place), F × userId (fixed), then the holding mark
//	returns 1 moved, 0 not (lease or cursor changed)
var admitHeldScript = redis.NewScript(wantsMemberLua + `
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'serving') or '0') ~= tonumber(ARGV[2]) then return 0 end
local na, np, nf = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local i = 7
for _ = 1, na do
  local uid = ARGV[i]
  if ARGV[i + 1] ~= '' then
    redis.call('HSET', KEYS[3], uid, ARGV[i + 1])
    redis.call('HSET', KEYS[4], uid, ARGV[i + 2])
  end
  if ARGV[i + 3] == '1' then
    local place = redis.call('HGET', KEYS[7], uid)
    local item = redis.call('HGET', KEYS[5], uid)
    if place and item then redis.call('ZREM', KEYS[8], wants(item, place, uid)) end
    redis.call('HDEL', KEYS[7], uid)
  end
  i = i + 4
end
for _ = 1, np do
  local uid = ARGV[i]
  local item = redis.call('HGET', KEYS[5], uid)
  if item then
    redis.call('HSET', KEYS[7], uid, ARGV[i + 1])
    redis.call('ZADD', KEYS[8], 0, wants(item, ARGV[i + 1], uid))
  end
  i = i + 2
end
for _ = 1, nf do
  redis.call('HDEL', KEYS[6], ARGV[i])
  i = i + 1
end
redis.call('HSET', KEYS[1], 'serving', ARGV[3])
redis.call('HSET', KEYS[1], 'holding', ARGV[i])
return 1
`)

// admitHeld runs admitHeldScript for pass p; moved reports whether the
// pass's changes were made.
func admitHeld(ctx context.Context, rdb redis.UniversalClient, saleID int64, me string, from, to int64, p *pass) (moved bool, err error) {
	args := make([]any, 0, 7+4*len(p.admits)+2*len(p.passes)+len(p.fixed))
	args = append(args, me, from, to, len(p.admits), len(p.passes), len(p.fixed))
	for _, a := range p.admits {
		rec := ""
		if a.atMs != 0 {
			rec = strconv.FormatInt(a.place, 10) + "|" + strconv.FormatInt(a.atMs, 10)
		}
		args = append(args, a.user, rec, a.item, boolArg(a.passed))
	}
	for _, a := range p.passes {
		args = append(args, a.user, a.place)
	}
	for _, u := range p.fixed {
		args = append(args, u)
	}
	args = append(args, max(to, p.holdingTo))
	keys := saleKeys(saleID, keyState, keyLease, keyAdmitted, keyHeldItem, keyChoice, keyFixed, keyPassed, keyWants)
	n, err := admitHeldScript.Run(ctx, rdb, keys, args...).Int()
	if err != nil {
		return false, fmt.Errorf("waitroom.admitHeld: %w", err)
	}
	return n == 1, nil
}

// heldBefore serves a place below p.holdingTo from the hold an earlier
// pass took for it and never admitted (a leader killed or frozen between
// its holds and admitHeld): ok with the hold's admission time and item.
// Without this, a first wave held by a leader that died at the draw has
// every unit held and none admitted, and the next leader, finding no free
// unit, would wait for those holds to lapse: a whole claim window with
// nobody buying.
func (r *Room) heldBefore(ctx context.Context, sale *flashsale.Sale, u, place int64, p *pass) (at, item int64, ok bool, err error) {
	if place >= p.holdingTo {
		return 0, 0, false, nil
	}
	item, end, held, err := r.cfg.Holds.Held(ctx, sale.ID, u)
	if err != nil || !held {
		return 0, 0, false, err
	}
	return end.Add(-sale.Window()).UnixMilli(), item, true, nil
}

// fieldHolding is the state's holding mark (markHolding): the place
// before which a leader's pass may have taken holds.
const fieldHolding = "holding"

// markHoldingScript raises the state's holding mark to ARGV[2] for the
// lease's holder: the pass is about to hold units for the places below
// it. Only the holder of the lease moves it, and it never goes down.
//
//	KEYS: state, lease
//	ARGV: me, to, fieldHolding
//	returns 1 marked, 0 not the leader
var markHoldingScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > tonumber(redis.call('HGET', KEYS[1], ARGV[3]) or '0') then
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[2])
end
return 1
`)

// markHolding runs markHoldingScript; ok false: this gateway no longer
// leads the sale and must not hold.
func markHolding(ctx context.Context, rdb redis.UniversalClient, saleID int64, me string, to int64) (ok bool, err error) {
	n, err := markHoldingScript.Run(ctx, rdb, saleKeys(saleID, keyState, keyLease), me, to, fieldHolding).Int()
	if err != nil {
		return false, fmt.Errorf("waitroom.markHolding: %w", err)
	}
	return n == 1, nil
}

// readHolding returns the state's holding mark (0: none).
func readHolding(ctx context.Context, rdb redis.UniversalClient, saleID int64) (int64, error) {
	n, err := rdb.HGet(ctx, lua.QueueKey(saleID, keyState), fieldHolding).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("waitroom.readHolding: %w", err)
	}
	return n, nil
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
