package waitroom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// rateSamples is how many ticks the measured admission rate looks back.
const rateSamples = 16

// saleRoom is one sale's local view: its connections and the last queue
// state read from Redis.
type saleRoom struct {
	id         int64
	registered bool // in activeKey (guarded by Room.mu)

	mu sync.Mutex
	// conns are the sale's connections on this gateway, each with what
	// the sweep keeps of it (connMark); unsettled and byPing index them
	// for a still tick's sweep, which visits only the unsettled ones and
	// pings only its ping slot's (addConn, setMark, removeConn keep the
	// three in step).
	conns     map[*conn]connMark
	unsettled map[*conn]struct{}
	byPing    []map[*conn]struct{} // by seq % pingSlots
	// shadowed are the connections showing the shadow queue
	// (checkShadowed looks them up, not every connection).
	shadowed map[*conn]struct{}
	// settledWaiting counts the settled connections that count as waiting
	// (a still tick does not visit them to count them).
	settledWaiting int
	// blocksGen is the blocklist's generation (Blocker.BlocksGen) that a
	// full sweep last checked every connection against: while it holds,
	// a still tick need not look at a settled connection for a kick.
	blocksGen uint64
	sale      *flashsale.Sale
	items     []AdmittedItem
	itemsJS   []byte // items, JSON-encoded once for the admitted messages
	loaded    bool
	st        queueState
	soldOut   bool
	// availableSince is when stock was first seen back after a sell-out
	// (zero while sold out or never sold out); see Config.ResumeDelay.
	availableSince time.Time
	// out is the items shown sold out; backSince, per item shown sold out,
	// when its stock was first seen back (the same ResumeDelay applies).
	out       *itemsOut
	backSince map[int64]time.Time
	// draw gives the pre-queue tickets their places: built when the draw
	// is seen (observe), or for a draw by tier once its tiers are read
	// (ensureDraw).
	draw *Draw
	// shadowChecked is when checkShadowed last looked up this gateway's
	// shadowed connections of the sale.
	shadowChecked time.Time
	entering      []dueStatus // scratch of the sweep (keepScratch)
	moved         []dueStatus // scratch of the sweep (keepScratch)
	touched       time.Time   // last polling use
	samples       [rateSamples]struct{ ms, serving int64 }
	nsample       int
	leadAt        int64 // serving when this gateway last led (-1: not leading)
	// notifiedTo is the cursor up to which this gateway, leading, has told
	// Config.Notify of a race-order sale's admissions (-1: not leading).
	notifiedTo int64
	lastBeat   time.Time // last presence mark of the admitted connections
	// viewed is what every view of the sale was last computed from
	// (viewInputs), at the last tick that visited every connection.
	viewed viewInputs

	// What Durable holds, as far as this gateway knows: checked once
	// (pgChecked), then kept up by its own checkpoints. savedSeq is the
	// number of tickets saved (-1: unknown); savedN and savedServing what
	// the last checkpoint wrote (a checkpoint with nothing new is skipped).
	pgChecked bool
	// published: the sale's public draw record is stored (publishDraw).
	published            bool
	pgAsked              bool       // the first tick's check ran
	askMu                sync.Mutex // held by the first check (firstCheck)
	pgHas                bool
	pgSt                 queueState
	savedSeq             int64
	savedN, savedServing int64

	// allocMu serializes the leader's allocation passes (allocate.go);
	// alloc is what they keep between ticks.
	allocMu sync.Mutex
	alloc   *allocState
	// holdsGen is the holds generation (fieldHoldsGen) as this gateway
	// last applied it to its connections (reissueHolds).
	holdsGen int64

	restoreMu sync.Mutex // one restore of the sale at a time on this gateway
	// The queue's restore epoch as last seen (see restoreScript).
	epoch     string
	epochSeen bool
}

// known is what this gateway knows of the queue, for the scripts' guard.
// Called with sr.mu held.
func (sr *saleRoom) known() known {
	st := sr.st
	st.Seq = max(st.Seq, sr.pgSt.Seq)
	st.Serving = max(st.Serving, sr.pgSt.Serving)
	if st.N < 0 {
		st.N, st.Tiered = sr.pgSt.N, sr.pgSt.Tiered
	}
	return known{st: st, guard: sr.pgHas || st.Seq > 0 || st.N >= 0 || st.Serving > 0}
}

func (sr *saleRoom) knownNow() known {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	return sr.known()
}

func (r *Room) saleRoom(id int64, create bool) *saleRoom {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.rooms[id]
	if sr == nil && create {
		sr = &saleRoom{id: id, conns: map[*conn]connMark{}, unsettled: map[*conn]struct{}{}, shadowed: map[*conn]struct{}{},
			byPing: make([]map[*conn]struct{}, r.cfg.pingSlots()),
			leadAt: -1, notifiedTo: -1, st: queueState{N: -1},
			pgSt: queueState{N: -1}, savedSeq: -1, savedN: -1}
		r.rooms[id] = sr
	}
	return sr
}

// setSale takes the sale as the cache has it now. Called with sr.mu held.
func (sr *saleRoom) setSale(sale *flashsale.Sale) {
	if sr.sale == nil || sr.sale != sale {
		sr.items = admittedItems(sale)
		sr.itemsJS, _ = json.Marshal(sr.items)
	}
	sr.sale = sale
}

// latestSale takes the cache's sale, so that an answer between two ticks
// shows the operator's last change (a pause, a message). Called with sr.mu
// held.
func (r *Room) latestSale(sr *saleRoom) {
	if sale, ok := r.sales.Sale(sr.id); ok && sr.sale != nil {
		sr.setSale(sale)
	}
}

// observe takes a newer queue state (the cursor only moves forward).
// Called with sr.mu held.
func (sr *saleRoom) observe(st queueState) {
	if st.Seq > sr.st.Seq {
		sr.st.Seq = st.Seq
	}
	if st.N >= 0 && sr.st.N < 0 {
		sr.st.N, sr.st.Tiered = st.N, st.Tiered
	}
	if st.Serving > sr.st.Serving {
		sr.st.Serving = st.Serving
	}
	if sr.st.N > 0 && sr.draw == nil && sr.sale != nil && !sr.st.Tiered {
		sr.draw = NewDraw(sr.sale.ShuffleSeed, uint64(sr.st.N), false, nil)
	}
}

// ensureDraw builds a draw by tier once st shows one: it reads the
// pre-queue's tiers from Redis (once per gateway and sale). Until then the
// pre-queue's places are unknown (place), as before the draw.
func (r *Room) ensureDraw(ctx context.Context, sr *saleRoom, sale *flashsale.Sale, st queueState) error {
	if st.N <= 0 || !st.Tiered || sale == nil {
		return nil
	}
	sr.mu.Lock()
	done := sr.draw != nil
	sr.mu.Unlock()
	if done {
		return nil
	}
	tiers, err := r.rdb.GetRange(ctx, lua.QueueKey(sr.id, keyTiers), 0, st.N-1).Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("waitroom.ensureDraw: sale %d: %w", sr.id, err)
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.draw == nil {
		sr.draw = NewDraw(sale.ShuffleSeed, uint64(st.N), true, tiers)
	}
	return nil
}

// place returns the place of ticket (ok false before the draw). Called
// with sr.mu held.
func (sr *saleRoom) place(ticket int64) (int64, bool) {
	if sr.st.N < 0 {
		return 0, false
	}
	if ticket < sr.st.N {
		if sr.draw == nil {
			return 0, false
		}
		return int64(sr.draw.Place(uint64(ticket))), true
	}
	return ticket, true
}

// rate is the measured admission rate (places/s over the last ticks), or
// the configured rate when nothing was measured. Called with sr.mu held.
func (sr *saleRoom) rate() float64 {
	n := min(sr.nsample, rateSamples)
	// The first wave, admitted at once at the draw, is no rate: measure
	// from the last sample at or before the opening.
	if s := sr.sale; s != nil {
		opens := s.StartsAt.UnixMilli()
		for n >= 2 && sr.samples[(sr.nsample-n+1)%rateSamples].ms <= opens {
			n--
		}
	}
	if n >= 2 {
		newest := sr.samples[(sr.nsample-1)%rateSamples]
		oldest := sr.samples[(sr.nsample-n)%rateSamples]
		d := newest.ms - oldest.ms
		if d > 0 && newest.serving > oldest.serving {
			return float64(newest.serving-oldest.serving) * 1000 / float64(d)
		}
		// Admission stalled over the window (the stock cap holds it back
		// until purchases or expiries free places): the average since
		// opening says more than the configured rate, which is not being
		// reached.
		if s := sr.sale; d > 0 && s != nil {
			if open := newest.ms - s.StartsAt.UnixMilli(); open > 0 && newest.serving > 0 {
				return float64(newest.serving) * 1000 / float64(open)
			}
		}
	}
	if sr.sale != nil && sr.sale.AdmissionRatePerSecond > 0 {
		return float64(sr.sale.AdmissionRatePerSecond)
	}
	return 0
}

// viewOf is what a shopper with this ticket (and place, -1 unknown) sees
// now. Called with sr.mu held.
func (sr *saleRoom) viewOf(place int64, now time.Time) view {
	s := sr.sale
	switch {
	case s != nil && !s.EndsAt.IsZero() && !now.Before(s.EndsAt):
		return view{state: StateEnded}
	case s != nil && s.Paused && (place < 0 || place >= sr.st.Serving):
		return view{state: StatePaused, out: sr.out}
	case s != nil && s.QueueOrder() && place >= 0 && place < sr.st.Serving:
		// In queue order an admitted shopper holds a unit, which no
		// sell-out takes away (every unit may be held).
		return view{state: StateAdmitted, out: sr.out}
	case sr.soldOut:
		return view{state: StateSoldOut, out: sr.out}
	case place < 0:
		return view{state: StatePrequeue, out: sr.out}
	case place < sr.st.Serving:
		return view{state: StateAdmitted, out: sr.out}
	}
	pos := place - sr.st.Serving
	v := view{state: StateWaiting, position: pos, out: sr.out}
	if rt := sr.rate(); rt > 0 {
		v.eta = int64(math.Ceil(float64(pos+1) / rt))
	}
	return v
}

// passedView is what a shopper sees whose place the cursor passed
// without an admission record: in queue order, passed over for want of
// the chosen item (next for it), or, a moment, a place whose record this
// gateway has not read yet. Called with sr.mu held.
func (sr *saleRoom) passedView(chosen int64) view {
	v := view{state: StateWaiting, out: sr.out, chosen: chosen}
	switch {
	case sr.sale != nil && sr.sale.Paused:
		v.state = StatePaused
	case sr.soldOut:
		v.state = StateSoldOut
	}
	return v
}

// untilOpening is how long until the sale's draw (DrawAt) or opening,
// whichever comes next, when it falls within the next tick; for a sale
// past its draw that this gateway has not seen drawn yet (the leader
// makes it), a tenth of tick, so that the other gateways learn the draw
// soon after it. 0: no early tick needed.
func (sr *saleRoom) untilOpening(now time.Time, tick, lead time.Duration) time.Duration {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.sale == nil {
		return 0
	}
	d := DrawAt(sr.sale, lead).Sub(now)
	if o := sr.sale.StartsAt.Sub(now); d <= 0 && o > 0 && o <= tick {
		return o
	}
	switch {
	case d > 0 && d <= tick:
		return d
	case d <= 0 && sr.st.N < 0 && len(sr.conns) > 0 && -d < 10*tick:
		return tick / 10
	}
	return 0
}

// showItems updates the items shown sold out from the stock rem (every
// item of the sale has a record): an item with none left is shown sold out
// at once, and shown back once its stock has been back for ResumeDelay, as
// the whole sale is (resumeHeld). A change makes a new set, which every
// shopper's next view carries. Called with sr.mu held.
func (r *Room) showItems(sr *saleRoom, rem map[int64]int64, now time.Time) {
	shown := map[int64]bool{}
	if sr.out != nil {
		for _, id := range sr.out.ids {
			shown[id] = true
		}
	}
	var ids []int64
	changed := sr.out == nil
	for _, it := range sr.sale.Items {
		switch {
		case rem[it.ID] <= 0:
			delete(sr.backSince, it.ID)
			changed = changed || !shown[it.ID]
			ids = append(ids, it.ID)
		case !shown[it.ID]:
		case r.cfg.ResumeDelay < 0:
			changed = true
		default:
			if sr.backSince == nil {
				sr.backSince = map[int64]time.Time{}
			}
			since, ok := sr.backSince[it.ID]
			if !ok {
				sr.backSince[it.ID], since = now, now
			}
			if now.Sub(since) < r.cfg.ResumeDelay {
				ids = append(ids, it.ID)
				continue
			}
			delete(sr.backSince, it.ID)
			changed = true
		}
	}
	if changed {
		sr.out = newItemsOut(ids)
	}
}

// resumeHeld is the sold-out state to show given the stock's: a sale that
// was sold out stays so until stock has been back for ResumeDelay. Called
// with sr.mu held.
func (r *Room) resumeHeld(sr *saleRoom, soldOut bool, now time.Time) bool {
	switch {
	case r.cfg.ResumeDelay < 0:
		return soldOut
	case soldOut:
		sr.availableSince = time.Time{}
		return true
	case !sr.soldOut:
		return false
	case sr.availableSince.IsZero():
		sr.availableSince = now
	}
	if now.Sub(sr.availableSince) < r.cfg.ResumeDelay {
		return true
	}
	sr.availableSince = time.Time{}
	return false
}

// viewInputs is what the sale room's views are computed from (viewOf),
// besides a connection's own place and choice: while it stays the same, a
// connection's view stays the one its last visit computed.
type viewInputs struct {
	// The sale by version, not by pointer: the cache makes new values at
	// every refresh (each second) whether or not the sale changed.
	version int64
	paused  bool
	ended   bool
	// The operator's message too: a sweep's visit sends it (sendMessage),
	// and a source that changes it without a new version must still reach
	// every connection.
	msg     string
	msgAt   int64
	serving int64
	n       int64
	soldOut bool
	out     *itemsOut
	rate    uint64 // math.Float64bits of rate()
}

// inputs are the room's viewInputs at now. Called with sr.mu held.
func (sr *saleRoom) inputs(now time.Time) viewInputs {
	in := viewInputs{serving: sr.st.Serving, n: sr.st.N, soldOut: sr.soldOut, out: sr.out}
	if s := sr.sale; s != nil {
		in.version, in.paused = s.Version, s.Paused
		in.msg, in.msgAt = s.Message, s.MessageAt.UnixMilli()
		in.ended = !s.EndsAt.IsZero() && !now.Before(s.EndsAt)
	}
	// The rate is read only by a WAITING view's ETA, and no view is
	// WAITING before the draw nor while the sale is sold out, paused or
	// ended. It is left out then: after the opening it moves every tick
	// (the average since the opening, while admission is stalled), and
	// would keep a sold-out sale's crowd from ever being still.
	if in.n >= 0 && !in.soldOut && !in.paused && !in.ended {
		in.rate = math.Float64bits(sr.rate())
	}
	return in
}

// connMark is what the sweep keeps of a connection in the map beside it,
// so that a sweep need not read its struct to know it. The zero mark is
// not settled: the next tick visits the connection.
type connMark struct {
	// settled: its last visit found it with no admission (waiting, in
	// the pre-queue, sold out, paused, ended), its place known once the
	// places are drawn, and owed nothing (the view computed is the one it
	// has). While the sale is still (tickPlan.still) a settled
	// connection's view cannot change, so no tick visits it.
	settled bool
	waiting bool // its view's state counts as waiting (waits)
}

// addConn adds c to the sale room, unsettled. Called with sr.mu held.
func (sr *saleRoom) addConn(c *conn) {
	sr.setMark(c, connMark{})
	i := c.seq % uint64(len(sr.byPing))
	if sr.byPing[i] == nil {
		sr.byPing[i] = map[*conn]struct{}{}
	}
	sr.byPing[i][c] = struct{}{}
	if c.shadow {
		sr.shadowed[c] = struct{}{}
	}
}

// shadow turns c into a shadowed connection showing the shadow queue's
// ticket shown. Called with sr.mu held.
func (sr *saleRoom) shadow(c *conn, shown int64) {
	c.ticket, c.shadow = shown, true
	if _, ok := sr.conns[c]; ok { // not left meanwhile
		sr.shadowed[c] = struct{}{}
	}
}

// removeConn takes c out of the sale room. Called with sr.mu held.
func (sr *saleRoom) removeConn(c *conn) {
	if m, ok := sr.conns[c]; ok && m.settled && m.waiting {
		sr.settledWaiting--
	}
	delete(sr.conns, c)
	delete(sr.unsettled, c)
	delete(sr.byPing[c.seq%uint64(len(sr.byPing))], c)
	delete(sr.shadowed, c)
}

// setMark records c's mark. Called with sr.mu held.
func (sr *saleRoom) setMark(c *conn, m connMark) {
	old, ok := sr.conns[c]
	if ok && old == m {
		return // a full sweep mostly finds the mark it left
	}
	if ok && old.settled && old.waiting {
		sr.settledWaiting--
	}
	if m.settled && m.waiting {
		sr.settledWaiting++
	}
	sr.conns[c] = m
	if m.settled {
		delete(sr.unsettled, c)
	} else {
		sr.unsettled[c] = struct{}{}
	}
}

// unsettle marks c for a visit on the next tick (its view changed outside
// the sweep). Called with sr.mu held.
func (sr *saleRoom) unsettle(c *conn) {
	if _, ok := sr.conns[c]; ok {
		sr.setMark(c, connMark{})
	}
}
