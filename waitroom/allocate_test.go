package waitroom

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/lua"
)

// stockHolds is the real stock's holds as the wiring gives them to the
// room (StockHolds), with a hook after each HoldMany.
type stockHolds struct {
	StockHolds
	afterHoldMany func()
}

func (h stockHolds) HoldMany(ctx context.Context, saleID int64, reqs []HoldReq, until time.Time) ([]error, error) {
	out, err := h.StockHolds.HoldMany(ctx, saleID, reqs, until)
	if h.afterHoldMany != nil {
		h.afterHoldMany()
	}
	return out, err
}

// queueEnv is a sale allocated in queue order on the real stock, with
// users 1…n in its pre-queue, and no gateway running: the tests drive
// rooms tick by tick (Room.refresh).
type queueEnv struct {
	*env
	st   *redisstock.Store
	sale *flashsale.Sale
}

// newQueueEnv makes the sale (id, one item of qty units, opening a second
// from the env's clock) and joins users 1…n through a running gateway,
// stopped before the draw; the lease it took is dropped.
func newQueueEnv(t *testing.T, id, qty, n int64) *queueEnv {
	t.Helper()
	ctx := context.Background()
	e := newEnv(t)
	st := redisstock.New(e.rdb)
	if err := st.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	sale := newSale(t, id, e.clock.Now().Add(time.Second), 10, qty)
	sale.Allocation, sale.ClaimWindow = flashsale.AllocationQueue, time.Minute
	e.sales.put(sale)
	if err := st.Load(ctx, sale.ID, map[int64]int64{sale.Items[0].ID: qty}); err != nil {
		t.Fatal(err)
	}
	q := &queueEnv{env: e, st: st, sale: sale}
	j := q.room(StockHolds{Stock: st})
	jctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = j.Run(jctx) }()
	for u := int64(1); u <= n; u++ {
		if _, err := j.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	<-done
	e.rdb.Del(ctx, lua.QueueKey(sale.ID, keyLease))
	return q
}

// room is a gateway's room on the env, not running.
func (q *queueEnv) room(h Holds) *Room { return q.roomWith(Config{Holds: h}) }

// roomWith is a gateway's room of cfg on the env, not running.
func (q *queueEnv) roomWith(cfg Config) *Room {
	q.testDefaults(&cfg)
	return New(cfg, q.rdb, q.sales, q.st, q.access, q.signer, nil, nil, nil)
}

// TestNewLeaderServesHoldsOfACutShortPass: the leader of a queue sale
// takes the first wave's holds at the draw and loses its lease before it
// admits them (frozen or killed between the two: the draw-kill fault).
// Every unit is then held and no place admitted. The next leader serves
// those places from their holds at its first tick, in the holds' own
// window; before, finding no free unit, it waited a whole claim window
// for the holds to lapse while nobody could buy.
func TestNewLeaderServesHoldsOfACutShortPass(t *testing.T) {
	ctx := context.Background()
	q := newQueueEnv(t, 71, 2, 3)
	e, st, sale := q.env, q.st, q.sale
	item := sale.Items[0].ID
	lease := lua.QueueKey(sale.ID, keyLease)
	// a loses its lease right after its holds (as if frozen past the
	// lease's lapse): its admissions are refused.
	logA, logB := &recordingNotifier{}, &recordingNotifier{}
	a := q.roomWith(Config{Holds: stockHolds{StockHolds: StockHolds{Stock: st}, afterHoldMany: func() { e.rdb.Del(ctx, lease) }}, Turns: logA})
	b := q.roomWith(Config{Holds: StockHolds{Stock: st}, Turns: logB})
	e.clock.Advance(2 * time.Second)
	if _, err := a.refresh(ctx, sale.ID, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if n, err := st.HoldCount(ctx, sale.ID); err != nil || n != 2 {
		t.Fatalf("holds after a's pass = %d, %v; want 2 (the test proves nothing)", n, err)
	}
	if adm, _ := e.rdb.HLen(ctx, lua.QueueKey(sale.ID, keyAdmitted)).Result(); adm != 0 {
		t.Fatalf("a admitted %d places without its lease", adm)
	}

	e.clock.Advance(100 * time.Millisecond)
	if _, err := b.refresh(ctx, sale.ID, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if got := b.saleRoom(sale.ID, false); got == nil {
		t.Fatal("b has no room for the sale")
	}
	serving, err := e.rdb.HGet(ctx, lua.QueueKey(sale.ID, keyState), fieldServing).Int64()
	if err != nil || serving != 2 {
		t.Fatalf("cursor after b's first tick = %d, %v; want 2 (both held places served)", serving, err)
	}
	recs, err := e.rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyAdmitted)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("admission records %v, want the two holders'", recs)
	}
	for u, rec := range recs {
		uid, _ := strconv.ParseInt(u, 10, 64)
		held, until, ok, err := st.Held(ctx, sale.ID, uid)
		if err != nil || !ok || held != item {
			t.Fatalf("user %d admitted without its hold (%d, %v, %v)", uid, held, ok, err)
		}
		// The record's time is the hold's window start: the window the
		// shopper was given is the one the hold lasts for.
		at, _ := strconv.ParseInt(rec[strings.IndexByte(rec, '|')+1:], 10, 64)
		if want := until.Add(-sale.Window()).UnixMilli(); at != want {
			t.Fatalf("user %d admitted at %d, want its hold's window start %d", uid, at, want)
		}
	}
	if n, _ := st.HoldCount(ctx, sale.ID); n != 2 {
		t.Fatalf("holds after b's pass = %d, want the same 2", n)
	}
	// Only the admissions that were made are told, as held turns, with
	// the places of their records.
	if len(logA.turns) != 0 {
		t.Errorf("a, refused, told of turns %v", logA.turns)
	}
	if len(logB.turns) != 2 || logB.kinds[flashsale.TurnHeld] != 2 {
		t.Fatalf("b told of turns %v (kinds %v), want the two held places", logB.turns, logB.kinds)
	}
	for _, tr := range logB.turns {
		rec := recs[strconv.FormatInt(tr.UserID, 10)]
		if want := rec[:strings.IndexByte(rec, '|')]; strconv.FormatInt(tr.Place, 10) != want {
			t.Errorf("turn %+v, want place %s (admission record %q)", tr, want, rec)
		}
	}
}

// afterFirstWave is newQueueEnv(t, id, qty, n) with a room that has run
// the first wave at the draw: every unit held, the cursor at qty.
func afterFirstWave(t *testing.T, id, qty, n int64) (*queueEnv, *Room) {
	t.Helper()
	q := newQueueEnv(t, id, qty, n)
	a := q.room(StockHolds{Stock: q.st})
	q.clock.Advance(2 * time.Second)
	if _, err := a.refresh(context.Background(), q.sale.ID, q.clock.Now()); err != nil {
		t.Fatal(err)
	}
	serving, err := q.rdb.HGet(context.Background(), lua.QueueKey(q.sale.ID, keyState), fieldServing).Int64()
	if err != nil || serving != qty {
		t.Fatalf("cursor after the first wave = %d, %v; want %d (every unit held)", serving, err, qty)
	}
	return q, a
}

// TestStaleHoldingMarkPassesNobodyOver: a holding mark past the cursor
// whose places hold nothing (a pass that marked them and then found no
// unit) changes nothing while every unit is held: the next place, whose
// chosen item has no unit free, waits in line as it would with no mark;
// it is not passed over. And once a pass admits past the mark, the mark
// follows the cursor.
func TestStaleHoldingMarkPassesNobodyOver(t *testing.T) {
	ctx := context.Background()
	q, a := afterFirstWave(t, 72, 1, 2)
	e, st, sale := q.env, q.st, q.sale
	item := sale.Items[0].ID
	state := lua.QueueKey(sale.ID, keyState)
	if h, err := e.rdb.HGet(ctx, state, fieldHolding).Int64(); err != nil || h != 1 {
		t.Fatalf("holding mark after the pass = %d, %v; want the cursor, 1", h, err)
	}
	// The second place chooses the (held) item, and a stale mark covers it.
	second := int64(2) // the drawn order decides which user holds
	if _, _, held, err := st.Held(ctx, sale.ID, 2); err != nil {
		t.Fatal(err)
	} else if held {
		second = 1
	}
	e.rdb.HSet(ctx, lua.QueueKey(sale.ID, keyChoice), second, item)
	e.rdb.HSet(ctx, state, fieldHolding, 5)
	e.clock.Advance(100 * time.Millisecond)
	if _, err := a.refresh(ctx, sale.ID, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.rdb.HLen(ctx, lua.QueueKey(sale.ID, keyPassed)).Result(); n != 0 {
		t.Fatalf("%d places passed over while every unit was held, under a stale mark", n)
	}
	if s, _ := e.rdb.HGet(ctx, state, fieldServing).Int64(); s != 1 {
		t.Fatalf("cursor moved to %d while every unit was held", s)
	}
	// Such a pass reads no choice and fixes none: a sold-out sale whose
	// mark stood past the cursor fixed and lifted thousands every tick.
	sr := a.saleRoom(sale.ID, false)
	sr.mu.Lock()
	qs := sr.st
	sr.mu.Unlock()
	p := pass{left: map[int64]int64{item: 0}, budget: maxHoldsPerTick, holdingTo: 5, marked: 5,
		fixUntil: e.clock.Now().Add(fixFor).UnixMilli()}
	sr.allocMu.Lock()
	pos, err := a.serveNew(ctx, sr, sale, qs, &p)
	sr.allocMu.Unlock()
	if err != nil || pos != 1 || len(p.fixed) != 0 || len(p.admits) != 0 {
		t.Fatalf("a pass with no unit free under a stale mark: cursor %d (%v), fixed %v, admits %v; want 1 and nothing",
			pos, err, p.fixed, p.admits)
	}
}

// TestPassReadsTheStockUnderItsLock: a pass given a stock count read
// before another pass held the units (the tick loop and advanceLoop both
// run the leader's refresh) reads the stock again under the sale's
// allocation lock and does nothing while no unit is free. On the older
// count it looked at the places after the first wave for units already
// gone and passed over those who had chosen an item, moving the cursor.
func TestPassReadsTheStockUnderItsLock(t *testing.T) {
	ctx := context.Background()
	q, a := afterFirstWave(t, 73, 2, 5)
	e, sale := q.env, q.sale
	item := sale.Items[0].ID
	state := lua.QueueKey(sale.ID, keyState)
	for u := int64(1); u <= 5; u++ {
		e.rdb.HSet(ctx, lua.QueueKey(sale.ID, keyChoice), u, item)
	}
	sr := a.saleRoom(sale.ID, false)
	sr.mu.Lock()
	qs := sr.st
	sr.mu.Unlock()
	stale := map[int64]int64{item: 2} // the count before the first wave's holds
	if _, to, err := a.allocate(ctx, sr, sale, qs, stale, e.clock.Now()); err != nil || to != 2 {
		t.Fatalf("a pass on a stale count: cursor %d, %v; want 2", to, err)
	}
	if s, _ := e.rdb.HGet(ctx, state, fieldServing).Int64(); s != 2 {
		t.Errorf("cursor moved to %d with every unit held", s)
	}
	if n, _ := e.rdb.HLen(ctx, lua.QueueKey(sale.ID, keyPassed)).Result(); n != 0 {
		t.Errorf("%d places passed over for units already held", n)
	}
	if h, _ := e.rdb.HGet(ctx, state, fieldHolding).Int64(); h != 2 {
		t.Errorf("holding mark %d, want the cursor, 2", h)
	}
}

// TestWindowStartInTheOpeningsMillisecond: a hold granted within the
// opening's millisecond but before its instant counts its window from
// the grant, never from the zero time; before that millisecond, from
// the opening (rounded up to the millisecond); after it, from the grant.
func TestWindowStartInTheOpeningsMillisecond(t *testing.T) {
	opens := time.Date(2026, 12, 6, 12, 0, 0, 123_456_789, time.UTC)
	sale := &flashsale.Sale{ID: 1, StartsAt: opens}
	for _, tc := range []struct {
		name      string
		now, want time.Time
	}{
		{"the draw, 3 s before", opens.Add(-3 * time.Second), opens.Truncate(time.Millisecond).Add(time.Millisecond)},
		{"the opening's millisecond, before its instant", opens.Add(-300 * time.Microsecond), opens.Add(-300 * time.Microsecond)},
		{"after the opening", opens.Add(time.Second), opens.Add(time.Second)},
	} {
		if got := windowStart(sale, tc.now); !got.Equal(tc.want) {
			t.Errorf("%s: window from %v, want %v", tc.name, got, tc.want)
		}
	}
}
