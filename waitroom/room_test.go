package waitroom

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

var testIP = netip.MustParseAddr("192.0.2.1")

// TestTwoGatewaysFairQueue: 2,000 shoppers over two gateways sharing one
// Redis. 1,200 join before opening (200 over WebSockets, the rest by
// polling), 800 after opening in four waves. Everyone is admitted exactly
// once; the pre-queue is admitted in the order of the draw, recomputed here
// from the published seed; later joiners in arrival order.
func TestTwoGatewaysFairQueue(t *testing.T) {
	e := newEnv(t)
	opens := e.clock.Now().Add(time.Hour)
	sale := e.addSale(newSale(t, 7, opens, 20_000, 10_000))
	gws := []*gateway{e.newGateway(Config{}, nil), e.newGateway(Config{}, nil)}
	ctx := context.Background()

	const preWS, prePoll, waves, perWave = 200, 1000, 4, 200
	var clients []*client
	wsUser := map[*client]int64{}
	for i := range preWS {
		c := dial(t, gws[i%2].url(sale.ID))
		user := int64(1 + i)
		c.join(e.token(user))
		clients = append(clients, c)
		wsUser[c] = user
	}
	joinAll := func(users []int64) map[int64]Status {
		t.Helper()
		var mu sync.Mutex
		out := map[int64]Status{}
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for i, u := range users {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				st, err := gws[i%2].room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, "")
				if err != nil {
					t.Errorf("join %d: %v", u, err)
					return
				}
				mu.Lock()
				out[u] = st
				mu.Unlock()
			})
		}
		wg.Wait()
		return out
	}
	var pollUsers []int64
	for i := range prePoll {
		pollUsers = append(pollUsers, int64(1+preWS+i))
	}
	for u, st := range joinAll(pollUsers) {
		if st.State != StatePrequeue || st.Position != 0 {
			t.Fatalf("user %d before opening: %+v, want PREQUEUE at 0", u, st)
		}
	}
	for _, c := range clients {
		if m := c.untilState(StatePrequeue); m.Position != 0 || m.OpensAtMs != opens.UnixMilli() {
			t.Fatalf("ws status %+v", m)
		}
	}
	// A reconnect before opening keeps the ticket (no new pre-queue entry).
	if _, err := gws[1].room.Join(ctx, flashsale.Principal{UserID: 1}, sale.ID, testIP, nil, ""); err != nil {
		t.Fatal(err)
	}

	e.clock.Advance(time.Hour) // open
	var waveUsers [][]int64
	next := int64(1 + preWS + prePoll)
	for range waves {
		var w []int64
		for range perWave {
			w = append(w, next)
			next++
		}
		joinAll(w)
		waveUsers = append(waveUsers, w)
	}
	const total = preWS + prePoll + waves*perWave

	// Let the cursor run: advance the clock in small steps until all are admitted.
	eventually(t, "everyone admitted", 20*time.Second, func() bool {
		e.clock.Advance(20 * time.Millisecond)
		f, err := gws[0].room.Figures(ctx, sale.ID)
		return err == nil && f.Admitted >= total
	})
	f, err := gws[1].room.Figures(ctx, sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	if f != (flashsale.QueueFigures{Joined: total, Admitted: total, Waiting: 0}) {
		t.Fatalf("figures = %+v, want joined=admitted=%d waiting=0", f, total)
	}

	// Every WebSocket shopper gets its admission; polling shoppers get theirs
	// from either gateway, and the token is the same on both.
	tokens := map[int64]string{}
	for _, c := range clients {
		m := c.untilAdmitted()
		if len(m.Items) != 1 || m.Items[0].PurchaseURL != fmt.Sprintf("/api/flash-sales/items/%d/purchase", sale.Items[0].ID) {
			t.Fatalf("admitted items = %+v", m.Items)
		}
		tokens[wsUser[c]] = m.AdmissionToken
	}
	for u := int64(1); u <= total; u++ {
		// A gateway learns the cursor at its own tick, which may come
		// after the other gateway's figures show everyone admitted.
		var st Status
		eventually(t, fmt.Sprintf("user %d admitted on gateway %d", u, u%2), 20*time.Second, func() bool {
			var err error
			st, err = gws[u%2].room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
			if err != nil {
				t.Fatalf("status %d: %v", u, err)
			}
			if st.State == StateAdmitted {
				return true
			}
			e.clock.Advance(20 * time.Millisecond)
			return false
		})
		if st.AdmissionToken == "" {
			t.Fatalf("user %d: %+v, want ADMITTED with a token", u, st)
		}
		if prev, ok := tokens[u]; ok && prev != st.AdmissionToken {
			t.Fatalf("user %d: token differs between WebSocket and polling", u)
		}
		if _, err := e.signer.Verify(st.AdmissionToken, u, sale.ID, e.clock.Now()); err != nil {
			t.Fatalf("user %d: token does not verify: %v", u, err)
		}
	}

	// Admitted exactly once: one admission record per user, places 0..total-1 each once.
	recs, err := e.rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyAdmitted)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != total {
		t.Fatalf("%d admission records, want %d", len(recs), total)
	}
	placeOf := map[int64]int64{}
	seenPlace := map[int64]bool{}
	for us, v := range recs {
		u, _ := strconv.ParseInt(us, 10, 64)
		p, _, err := parseAdmission(v)
		if err != nil || seenPlace[p] || p < 0 || p >= total {
			t.Fatalf("record %s=%q: bad or duplicate place", us, v)
		}
		seenPlace[p] = true
		placeOf[u] = p
	}

	// The draw, recomputed from the published seed and pre-queue list.
	sum := sha256.Sum256(sale.ShuffleSeed)
	if hex.EncodeToString(sum[:]) != sale.ShuffleCommitment {
		t.Fatal("commitment is not sha256(seed)")
	}
	pre, frozen, err := PreQueue(ctx, e.rdb, sale.ID)
	if err != nil || !frozen {
		t.Fatalf("PreQueue: frozen=%v err=%v", frozen, err)
	}
	if len(pre) != preWS+prePoll {
		t.Fatalf("pre-queue has %d users, want %d", len(pre), preWS+prePoll)
	}
	for i, u := range pre {
		if want := int64(refPlace(sale.ShuffleSeed, uint64(len(pre)), uint64(i))); placeOf[u] != want {
			t.Fatalf("pre-queue user %d (ticket %d): place %d, draw says %d", u, i, placeOf[u], want)
		}
	}
	// Later joiners: behind the pre-queue, in arrival order (wave by wave).
	lastMax := int64(len(pre) - 1)
	for w, users := range waveUsers {
		var ps []int64
		for _, u := range users {
			ps = append(ps, placeOf[u])
		}
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
		if ps[0] <= lastMax {
			t.Fatalf("wave %d: place %d not behind %d", w, ps[0], lastMax)
		}
		lastMax = ps[len(ps)-1]
	}
	rep, err := VerifyDraw(ctx, e.rdb, sale)
	if err != nil || !rep.OK || rep.Checked != total || !rep.CommitmentOK {
		t.Fatalf("VerifyDraw = %+v, %v", rep, err)
	}
	for place, u := range rep.Order {
		if placeOf[u] != int64(place) {
			t.Fatalf("report order: place %d holds %d, admitted at %d", place, u, placeOf[u])
		}
	}
}

func TestVerifyDrawDetectsTampering(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 3, e.clock.Now().Add(time.Minute), 1000, 100))
	g := e.newGateway(Config{}, nil)
	ctx := context.Background()
	for u := int64(1); u <= 50; u++ {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Minute)
	eventually(t, "all admitted", 10*time.Second, func() bool {
		e.clock.Advance(50 * time.Millisecond)
		for u := int64(1); u <= 50; u++ {
			st, err := g.room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
			if err != nil || st.State != StateAdmitted {
				return false
			}
		}
		return true
	})
	rep, err := VerifyDraw(ctx, e.rdb, sale)
	if err != nil || !rep.OK {
		t.Fatalf("VerifyDraw = %+v, %v", rep, err)
	}
	// Swap two pre-queue users' admission places: the check must notice.
	a, b := strconv.FormatInt(rep.Order[0], 10), strconv.FormatInt(rep.Order[1], 10)
	ra, _ := e.rdb.HGet(ctx, lua.QueueKey(sale.ID, keyAdmitted), a).Result()
	rb, _ := e.rdb.HGet(ctx, lua.QueueKey(sale.ID, keyAdmitted), b).Result()
	e.rdb.HSet(ctx, lua.QueueKey(sale.ID, keyAdmitted), a, rb, b, ra)
	rep, err = VerifyDraw(ctx, e.rdb, sale)
	if err != nil || rep.OK || len(rep.Mismatches) != 2 {
		t.Fatalf("tampered VerifyDraw = OK %v mismatches %v, err %v", rep.OK, rep.Mismatches, err)
	}
	other := *sale
	other.ShuffleCommitment = "00"
	if rep, _ := VerifyDraw(ctx, e.rdb, &other); rep.CommitmentOK || rep.OK {
		t.Fatal("wrong commitment passed")
	}
}

// TestSoldOutResumeReconnect uses a stopped clock: the cursor moves only when
// the test advances it.
func TestSoldOutResumeReconnect(t *testing.T) {
	e := newEnv(t)
	// Opened a moment ago: the rate's credit starts at the opening, so no
	// place is due before the clock moves.
	sale := e.addSale(newSale(t, 5, e.clock.Now().Add(-time.Millisecond), 1, 5))
	item := sale.Items[0].ID
	g := e.newGateway(Config{AdmissionTTL: time.Minute}, nil)

	a, b, c := dial(t, g.url(sale.ID)), dial(t, g.url(sale.ID)), dial(t, g.url(sale.ID))
	a.join(e.token(1))
	if m := a.untilState(StateWaiting); m.Position != 0 {
		t.Fatalf("a: %+v", m)
	}
	b.join(e.token(2))
	if m := b.untilState(StateWaiting); m.Position != 1 {
		t.Fatalf("b: %+v", m)
	}
	c.join(e.token(3))
	if m := c.untilState(StateWaiting); m.Position != 2 || m.EtaSeconds < 1 {
		t.Fatalf("c: %+v", m)
	}

	e.clock.Advance(time.Second) // rate 1/s: one place
	a.untilState(StateAdmitted)
	admA := a.untilAdmitted()
	if admA.ExpiresAtMs != e.clock.Now().Add(time.Minute).UnixMilli() && admA.ExpiresAtMs > e.clock.Now().Add(time.Minute).UnixMilli() {
		t.Fatalf("expiresAtMs %d", admA.ExpiresAtMs)
	}
	b.until("b at position 0", 5*time.Second, func(m msg) bool { return m.Type == TypeStatus && m.Position == 0 })

	// Sold out: every connected shopper, admitted or waiting, hears it.
	e.stock.set(sale.ID, item, 0)
	for _, cl := range []*client{a, b, c} {
		cl.untilState(StateSoldOut)
	}
	e.clock.Advance(3 * time.Second) // no admission while sold out
	g.waitTicks(t, 2)
	d := dial(t, g.url(sale.ID))
	d.join(e.token(4))
	d.untilState(StateSoldOut)

	// Stock comes back: after the resume delay (which lets every gateway's
	// sold-out flag clear first), admission resumes in queue order.
	e.stock.set(sale.ID, item, 2)
	g.waitTicks(t, 2)
	if st, err := g.room.Status(context.Background(), flashsale.Principal{UserID: 4}, sale.ID); err != nil || st.State != StateSoldOut {
		t.Fatalf("before the resume delay passed: %+v %v, want SOLD_OUT still", st, err)
	}
	e.clock.Advance(800 * time.Millisecond) // past the 750ms delay, short of a second admission at 1/s
	a.untilState(StateAdmitted)
	if m := b.untilState(StateWaiting); m.Position != 0 {
		t.Fatalf("b after restock: %+v", m)
	}
	if m := c.untilState(StateWaiting); m.Position != 1 {
		t.Fatalf("c after restock: %+v", m)
	}
	e.clock.Advance(time.Second)
	b.untilState(StateAdmitted)
	admB := b.untilAdmitted()

	// A second tab and a reconnect keep the place and the token.
	a2 := dial(t, g.url(sale.ID))
	a2.join(e.token(1))
	a2.untilState(StateAdmitted)
	if m := a2.untilAdmitted(); m.AdmissionToken != admA.AdmissionToken || m.ExpiresAtMs != admA.ExpiresAtMs {
		t.Fatalf("second tab got another token")
	}
	_ = b.ws.CloseNow()
	b2 := dial(t, g.url(sale.ID))
	b2.join(e.token(2))
	if m := b2.untilAdmitted(); m.AdmissionToken != admB.AdmissionToken {
		t.Fatal("reconnect got another token")
	}
	c2 := dial(t, g.url(sale.ID))
	c2.join(e.token(3))
	if m := c2.untilState(StateWaiting); m.Position != 0 {
		t.Fatalf("c second tab: %+v", m)
	}

	// The token is valid until expiresAtMs, not at it.
	exp := time.UnixMilli(admA.ExpiresAtMs)
	if _, err := e.signer.Verify(admA.AdmissionToken, 1, sale.ID, exp.Add(-time.Millisecond)); err != nil {
		t.Fatalf("token before expiry: %v", err)
	}
	if _, err := e.signer.Verify(admA.AdmissionToken, 1, sale.ID, exp); err == nil {
		t.Fatal("token at expiry still verifies")
	}
	if _, err := e.signer.Verify(admA.AdmissionToken, 2, sale.ID, e.clock.Now()); err == nil {
		t.Fatal("token verifies for another user")
	}
}

// TestCapacityCap: admitted-unused places stay within factor × remaining; an
// expired admission frees its capacity.
func TestCapacityCap(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 9, e.clock.Now().Add(-time.Second), 100, 2))
	g := e.newGateway(Config{AdmissionTTL: 10 * time.Second, CapacityFactor: 2}, nil)
	g.joinUsers(t, sale.ID, 10)
	serving := func() int64 { return g.admitted(t, sale.ID) }
	e.clock.Advance(time.Second) // the rate would allow 100
	eventually(t, "4 admitted", 5*time.Second, func() bool { return serving() == 4 })
	e.clock.Advance(2 * time.Second)
	g.waitTicks(t, 3) // nothing more may be admitted
	if got := serving(); got != 4 {
		t.Fatalf("admitted %d with stock 2 and factor 2, want 4", got)
	}
	e.clock.Advance(10 * time.Second) // the first admissions expire
	eventually(t, "4 more admitted", 5*time.Second, func() bool { return serving() == 8 })
	// Live rate change: rate 0 stops admission even with capacity free.
	s2 := *sale
	s2.AdmissionRatePerSecond = 0
	e.sales.put(&s2)
	e.clock.Advance(11 * time.Second)
	g.waitTicks(t, 3)
	if got := serving(); got != 8 {
		t.Fatalf("admitted %d after rate 0, want 8", got)
	}
}

func TestPollingErrors(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 4, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{}, guardFunc(func(userID int64, pow json.RawMessage) (json.RawMessage, error) {
		switch {
		case userID == 666:
			return nil, flashsale.Errorf(flashsale.CodeBlocked, "blocked")
		case userID == 42 && pow == nil:
			return []byte(`{"difficulty":4,"prefix":"ab"}`), nil
		}
		return nil, nil
	}))
	ctx := context.Background()
	if _, err := g.room.Join(ctx, flashsale.Principal{UserID: 1}, 999, testIP, nil, ""); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Fatalf("unknown sale: %v", err)
	}
	if _, err := g.room.Join(ctx, flashsale.Principal{UserID: 666}, sale.ID, testIP, nil, ""); flashsale.ErrorCode(err) != flashsale.CodeBlocked {
		t.Fatalf("blocked: %v", err)
	}
	st, err := g.room.Join(ctx, flashsale.Principal{UserID: 42}, sale.ID, testIP, nil, "")
	if err != nil || st.Type != TypeChallenge || string(st.Challenge) != `{"difficulty":4,"prefix":"ab"}` {
		t.Fatalf("challenge: %+v %v", st, err)
	}
	if st, err := g.room.Join(ctx, flashsale.Principal{UserID: 42}, sale.ID, testIP, []byte(`{"nonce":"1"}`), ""); err != nil || st.State != StatePrequeue {
		t.Fatalf("join with pow: %+v %v", st, err)
	}
	if _, err := g.room.Status(ctx, flashsale.Principal{UserID: 43}, sale.ID); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Fatalf("status without join: %v", err)
	}
}

type guardFunc func(userID int64, pow json.RawMessage) (json.RawMessage, error)

func (f guardFunc) CheckJoin(_ context.Context, _ netip.Addr, userID, _ int64, pow json.RawMessage) (json.RawMessage, error) {
	return f(userID, pow)
}

// TestCapacityAfterStockReturns: places that were bought stay counted as
// used when units come back (an expiry or cancel), so admission resumes for
// the returned units instead of stalling behind phantom "unused" places.
func TestCapacityAfterStockReturns(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 11, e.clock.Now().Add(-time.Second), 100, 2))
	item := sale.Items[0].ID
	g := e.newGateway(Config{AdmissionTTL: time.Minute, CapacityFactor: 1}, nil)
	ctx := context.Background()
	for u := int64(1); u <= 10; u++ {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	admitted := func() int64 {
		f, err := g.room.Figures(ctx, sale.ID)
		if err != nil {
			t.Fatal(err)
		}
		return f.Admitted
	}
	e.clock.Advance(time.Second)
	eventually(t, "2 admitted", 5*time.Second, func() bool { return admitted() == 2 })
	// Both admitted shoppers buy (the reserve script counts them) and the
	// stock runs out.
	if err := e.rdb.IncrBy(ctx, lua.ReservedKey(sale.ID), 2).Err(); err != nil {
		t.Fatal(err)
	}
	e.stock.set(sale.ID, item, 0)
	e.clock.Advance(time.Second)
	g.waitTicks(t, 3)
	// One order expires: its unit comes back. The next shopper is admitted
	// well within the admission TTL, not after it.
	e.stock.set(sale.ID, item, 1)
	e.clock.Advance(time.Second)
	eventually(t, "a third shopper admitted for the returned unit", 5*time.Second, func() bool { return admitted() == 3 })
	g.waitTicks(t, 3)
	if got := admitted(); got != 3 {
		t.Fatalf("admitted %d for one returned unit with factor 1, want 3", got)
	}
}

// TestWaitingStatusesPaced: at the opening, shoppers entering WAITING are
// told at most WaitingPushes per second (one per 10ms tick here), every one
// of them eventually; position updates come at most every StatusEvery; an
// admission is never held back.
func TestWaitingStatusesPaced(t *testing.T) {
	e := newEnv(t)
	opens := e.clock.Now().Add(time.Second)
	sale := e.addSale(newSale(t, 21, opens, 1, 100))
	g := e.newGateway(Config{AdmissionTTL: time.Minute, WaitingPushes: 100, StatusEvery: time.Hour}, nil)
	const n = 8
	clients := prequeued(t, e, g, sale.ID, n)
	e.clock.Advance(time.Second) // open: the draw gives all 8 a place at once
	places := map[int64]*client{}
	for _, c := range clients {
		m := c.untilState(StateWaiting)
		if places[m.Position] != nil {
			t.Fatalf("two shoppers at position %d", m.Position)
		}
		places[m.Position] = c
	}
	if d := g.counter(t, "flashsale_waitroom_status_deferred_total"); d < n-1 {
		t.Errorf("%v WAITING statuses deferred, want >= %d (one per tick)", d, n-1)
	}
	// The cursor moves one place: position 0 is admitted at once; the
	// others' positions change but StatusEvery holds their updates back.
	e.clock.Advance(time.Second)
	places[0].untilAdmitted()
	g.waitTicks(t, 5)
	for pos := int64(1); pos < n; pos++ {
		if m, err := places[pos].read(50 * time.Millisecond); err == nil {
			t.Errorf("position %d got %+v before StatusEvery passed", pos, m)
		}
	}
}

// counter is the value of one of the gateway's counters.
func (g *gateway) counter(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := g.counterValue(t, name, "")
	if !ok {
		t.Fatalf("no counter %s", name)
	}
	return v
}

// counterValue is the value of the gateway's counter name: its only
// series when label is "", else the series whose (single) label has that
// value; ok is false when there is none.
func (g *gateway) counterValue(t *testing.T, name, label string) (v float64, ok bool) {
	t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			unlabeled := label == "" && len(mf.GetMetric()) == 1
			if unlabeled || (label != "" && len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() == label) {
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestWaitingStatusesFrontFirst: when the pacing holds WAITING statuses
// back, the front of the queue hears first.
func TestWaitingStatusesFrontFirst(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 22, e.clock.Now().Add(time.Second), 1, 100))
	// One WAITING status per 100ms tick.
	g := e.newGateway(Config{Tick: 100 * time.Millisecond, AdmissionTTL: time.Minute, WaitingPushes: 10, StatusEvery: time.Hour}, nil)
	const n = 6
	clients := prequeued(t, e, g, sale.ID, n)
	e.clock.Advance(time.Second)
	type arrival struct {
		pos int64
		at  time.Time
	}
	got := make(chan arrival, n)
	for _, c := range clients {
		go func() {
			m, err := c.read(10 * time.Second)
			if err != nil || m.State != StateWaiting {
				got <- arrival{pos: -1}
				return
			}
			got <- arrival{pos: m.Position, at: time.Now()}
		}()
	}
	arrivals := make([]arrival, 0, n)
	for range n {
		a := <-got
		if a.pos < 0 {
			t.Fatal("a shopper did not get WAITING")
		}
		arrivals = append(arrivals, a)
	}
	sort.Slice(arrivals, func(i, j int) bool { return arrivals[i].pos < arrivals[j].pos })
	for i := 1; i < n; i++ {
		if arrivals[i].at.Before(arrivals[i-1].at) {
			t.Errorf("position %d heard at %v, before position %d at %v",
				arrivals[i].pos, arrivals[i].at.Format("15:04:05.000"), arrivals[i-1].pos, arrivals[i-1].at.Format("15:04:05.000"))
		}
	}
}

// TestWaitingStatusesYieldToSaleRequests: while the sale's requests come
// in (Config.Competing), a tick's WAITING budget shrinks by them down to a
// tenth, so shoppers entering WAITING are told over more ticks, every one
// of them still; a keep-alive ping waits one slot, never two in a row.
func TestWaitingStatusesYieldToSaleRequests(t *testing.T) {
	for _, busy := range []bool{true, false} {
		t.Run(map[bool]string{true: "busy", false: "quiet"}[busy], func(t *testing.T) {
			e := newEnv(t)
			sale := e.addSale(newSale(t, 23, e.clock.Now().Add(time.Second), 1, 100))
			cfg := Config{Tick: 100 * time.Millisecond, AdmissionTTL: time.Minute, StatusEvery: time.Hour,
				WaitingPushes: 100,             // 10 WAITING statuses a tick
				IdleTimeout:   2 * time.Second, // a ping slot every 10 ticks
			}
			var reqs atomic.Int64
			if busy {
				// 1,000 purchases and order reads between two ticks: the
				// budget falls to its floor, one status a tick
				cfg.Competing = func() int64 { return reqs.Add(1000) }
			}
			g := e.newGateway(cfg, nil)
			const n = 12
			clients := prequeued(t, e, g, sale.ID, n)
			e.clock.Advance(time.Second)
			ticks := make(chan uint64, n)
			for _, c := range clients {
				go func() {
					if _, err := c.until1(StateWaiting, 10*time.Second); err != nil {
						ticks <- 0
						return
					}
					g.room.mu.Lock()
					ticks <- g.room.tickCount
					g.room.mu.Unlock()
					// keep reading, so pings are answered, until the
					// test's end closes the connection
					for {
						if _, err := c.read(time.Minute); err != nil {
							return
						}
					}
				}()
			}
			first, last := uint64(math.MaxUint64), uint64(0)
			for range n {
				tk := <-ticks
				if tk == 0 {
					t.Fatal("a shopper was not told WAITING")
				}
				first, last = min(first, tk), max(last, tk)
			}
			if busy && last-first < n/2 {
				t.Errorf("%d WAITING statuses told over ticks %d…%d, want them spread over %d ticks or more (one a tick)", n, first, last, n/2)
			}
			g.waitTicks(t, 25) // every connection's ping slot comes twice or more
			sent, waited := g.pings(t, "sent"), g.pings(t, "waited")
			switch {
			case busy && (waited < 1 || sent < 1 || waited > sent+n):
				t.Errorf("busy: pings sent %v, waited %v; want both, and never two waits in a row (waited ≤ sent + %d)", sent, waited, n)
			case !busy && (waited != 0 || sent < n):
				t.Errorf("quiet: pings sent %v, waited %v; want every connection pinged and none waiting", sent, waited)
			}
		})
	}
}

// pings is flashsale_waitroom_pings_total{outcome} (0 before the first).
func (g *gateway) pings(t *testing.T, outcome string) float64 {
	t.Helper()
	v, _ := g.counterValue(t, "flashsale_waitroom_pings_total", outcome)
	return v
}

// prequeued connects users 1…n to sale's queue on g before its opening and
// waits until each is in the pre-queue.
func prequeued(t *testing.T, e *env, g *gateway, saleID int64, n int) []*client {
	t.Helper()
	return joined(t, e, g, saleID, n, StatePrequeue)
}

// joined connects users 1…n to sale's queue on g, one after the other, and
// waits until each is told state.
func joined(t *testing.T, e *env, g *gateway, saleID int64, n int, state string) []*client {
	t.Helper()
	clients := make([]*client, n)
	for i := range clients {
		clients[i] = dial(t, g.url(saleID))
		clients[i].join(e.token(int64(i + 1)))
		clients[i].untilState(state)
	}
	return clients
}

// TestOpeningTick: a sale that opens between two ticks gets a tick right
// after its opening instant (the draw does not wait for the ticker), and
// the rate's credit runs from the opening, so the first tick after it
// already admits what the time since the opening allows.
func TestOpeningTick(t *testing.T) {
	t.Run("aligned", func(t *testing.T) {
		e := newEnv(t)
		sale := e.addSale(newSale(t, 11, e.clock.Now().Add(400*time.Millisecond), 1, 5))
		// The sale has a queue already (another gateway's shoppers), so
		// the start's tick knows it. The ticker never fires during the
		// test: only the start's tick and the opening's own ticks run.
		if err := e.rdb.SAdd(context.Background(), activeKey, sale.ID).Err(); err != nil {
			t.Fatal(err)
		}
		g := e.newGateway(Config{Tick: time.Hour}, nil)
		a := dial(t, g.url(sale.ID))
		a.join(e.token(1))
		a.untilState(StatePrequeue)
		// The opening instant: the opening's tick (re-armed while the test
		// clock stands before it) makes the draw.
		e.clock.Advance(400 * time.Millisecond)
		if m := a.untilState(StateWaiting); m.Position != 0 {
			t.Fatalf("after the opening tick: %+v", m)
		}
	})
	t.Run("credit from the opening", func(t *testing.T) {
		e := newEnv(t)
		sale := e.addSale(newSale(t, 12, e.clock.Now().Add(time.Second), 10, 100))
		g := e.newGateway(Config{}, nil)
		g.joinUsers(t, sale.ID, 20)
		g.waitTicks(t, 2)
		// The first tick to see the sale open comes 500 ms after the
		// opening: 10/s × 0.5 s = 5 places at once; the clock then stands
		// still, so no later tick adds any.
		e.clock.Advance(1500 * time.Millisecond)
		g.waitTicks(t, 3)
		if got := g.admitted(t, sale.ID); got != 5 {
			t.Fatalf("admitted %d half a second after the opening at 10/s, want 5", got)
		}
	})
}

// TestAdvanceWithTheTickLoop: the leader's cursor is moved both by the
// tick loop and by advanceLoop; together they keep the configured rate and
// count every admitted place once.
func TestAdvanceWithTheTickLoop(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 13, e.clock.Now().Add(-time.Millisecond), 100, 1000))
	g := e.newGateway(Config{}, nil)
	g.joinUsers(t, sale.ID, 60)
	admitted := func() int64 { return g.admitted(t, sale.ID) }
	// 100/s in ten steps of 50 ms: 50 places, however the two loops
	// interleave with the steps.
	for range 10 {
		e.clock.Advance(50 * time.Millisecond)
		g.waitTicks(t, 2)
	}
	eventually(t, "50 admitted", 5*time.Second, func() bool { return admitted() == 50 })
	g.waitTicks(t, 3)
	if got := admitted(); got != 50 {
		t.Fatalf("admitted %d after 500 ms at 100/s, want 50", got)
	}
	mfs, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64 = -1
	for _, mf := range mfs {
		if mf.GetName() == "flashsale_waitroom_admitted_total" {
			counted = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if counted != 50 {
		t.Fatalf("flashsale_waitroom_admitted_total %v, want 50", counted)
	}
}

// TestExpiredAdmissionRequeued: a shopper whose admission expires unused
// goes to the back of the queue (WAITING again, over WebSocket and over
// polling), as its rejoin would; a shopper who bought keeps ADMITTED.
func TestExpiredAdmissionRequeued(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 24, e.clock.Now().Add(-time.Millisecond), 3, 100))
	g := e.newGateway(Config{AdmissionTTL: 10 * time.Second}, nil)
	ab := joined(t, e, g, sale.ID, 2, StateWaiting)
	a, b := ab[0], ab[1]
	if _, err := g.room.Join(context.Background(), flashsale.Principal{UserID: 3}, sale.ID, testIP, nil, ""); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second) // rate 3/s: all three admitted
	first := a.untilAdmitted()
	b.untilAdmitted()
	st, err := g.room.Status(context.Background(), flashsale.Principal{UserID: 3}, sale.ID)
	if err != nil || st.State != StateAdmitted || st.AdmissionToken == "" {
		t.Fatalf("polling user 3: %+v, %v; want ADMITTED with a token", st, err)
	}
	// User 2 buys; then nobody is admitted any more, and the tokens expire.
	if err := e.rdb.HSet(context.Background(), lua.BuyersKey(sale.ID), "2", "order-2|2401|1").Err(); err != nil {
		t.Fatal(err)
	}
	s2 := *sale
	s2.AdmissionRatePerSecond = 0
	e.sales.put(&s2)
	e.clock.Advance(10 * time.Second)

	m := a.untilState(StateWaiting)
	if m.Position < 0 {
		t.Fatalf("requeued shopper: %+v", m)
	}
	st, err = g.room.Status(context.Background(), flashsale.Principal{UserID: 3}, sale.ID)
	if err != nil || st.State != StateWaiting || st.AdmissionToken != "" {
		t.Fatalf("polling user 3 after its admission expired: %+v, %v; want WAITING without a token", st, err)
	}
	g.waitTicks(t, 3)
	if m, err := b.read(100 * time.Millisecond); err == nil {
		t.Errorf("the buyer got %+v after its admission expired, want nothing (it keeps ADMITTED)", m)
	}
	// Admission resumes: the requeued shopper is admitted again, with a
	// token that outlives the first.
	e.sales.put(sale)
	e.clock.Advance(time.Second)
	again := a.untilAdmitted()
	if again.ExpiresAtMs <= first.ExpiresAtMs || again.AdmissionToken == first.AdmissionToken {
		t.Errorf("second admission %+v, want a new token expiring after %d", again, first.ExpiresAtMs)
	}
}

// TestOpeningHold: for OpeningHold from the opening a WAITING shopper gets
// no position update, while an admission still goes out at once; once the
// hold ends the positions catch up.
func TestOpeningHold(t *testing.T) {
	e := newEnv(t)
	opens := e.clock.Now().Add(time.Second)
	sale := e.addSale(newSale(t, 23, opens, 1, 100))
	g := e.newGateway(Config{AdmissionTTL: time.Minute, WaitingPushes: -1, StatusEvery: time.Millisecond,
		OpeningHold: 5 * time.Second}, nil)
	const n = 12
	clients := prequeued(t, e, g, sale.ID, n)
	e.clock.Advance(time.Second) // the opening: the draw places every shopper
	places := map[int64]*client{}
	for _, c := range clients {
		m := c.untilState(StateWaiting) // entering WAITING is not held
		places[m.Position] = c
	}
	if len(places) != n {
		t.Fatalf("%d distinct positions, want %d", len(places), n)
	}
	// One second into the hold the cursor moves one place: position 0 is
	// admitted at once, the others' positions wait. (A read that times out
	// closes its WebSocket: positions 1–4 are looked at here, 8 and on
	// after the hold.)
	e.clock.Advance(time.Second)
	places[0].untilAdmitted()
	g.waitTicks(t, 5)
	for pos := int64(1); pos <= 4; pos++ {
		if m, err := places[pos].read(20 * time.Millisecond); err == nil {
			t.Errorf("position %d got %+v during the hold", pos, m)
		}
	}
	if held := g.counter(t, "flashsale_waitroom_status_deferred_total"); held == 0 {
		t.Error("no position update counted as held back")
	}
	// Past the hold (6 s after the opening, about 6 admitted) the back of
	// the queue hears its new positions.
	e.clock.Advance(5 * time.Second)
	for pos := int64(8); pos < n; pos++ {
		m := places[pos].untilState(StateWaiting)
		if m.Position >= pos {
			t.Errorf("place %d: position %d after the hold, want < %d", pos, m.Position, pos)
		}
	}
}

// TestJoinSaleGoneBeforeLoad: a sale that leaves the sales cache between a
// join and the room's first read of it (deleted, or a reload without it)
// is answered NOT_FOUND, by WebSocket and by polling. The WebSocket join
// used to crash the gateway on the room's missing sale.
func TestJoinSaleGoneBeforeLoad(t *testing.T) {
	e := newEnv(t)
	ws := e.addSale(newSale(t, 6, e.clock.Now().Add(time.Minute), 10, 10))
	poll := e.addSale(newSale(t, 7, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{}, nil)
	// One read left: the join's own look at the sale.
	e.sales.vanishAfter(ws.ID, 1)
	e.sales.vanishAfter(poll.ID, 1)
	c := dial(t, g.url(ws.ID))
	c.join(e.token(1))
	if m := c.until("an error", 5*time.Second, func(m msg) bool { return m.Type == "error" }); m.Error != "NOT_FOUND" {
		t.Fatalf("WebSocket join of a sale gone before its load: %+v, want NOT_FOUND", m)
	}
	if _, err := g.room.Join(context.Background(), flashsale.Principal{UserID: 2}, poll.ID, testIP, nil, ""); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Fatalf("polling join of a sale gone before its load: %v, want NOT_FOUND", err)
	}
}

// TestOnePlacePerIdentityKey: two users with one identity key join at the
// same moment on two gateways, one by WebSocket and one by polling, many
// times over: exactly one gets a place, the other is refused
// DUPLICATE_IDENTITY. The holder joins again with it; other keys, and
// tokens without one, are not affected.
func TestOnePlacePerIdentityKey(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 8, e.clock.Now().Add(time.Minute), 10, 10))
	g1 := e.newGateway(Config{}, nil)
	g2 := e.newGateway(Config{}, nil)
	ctx := context.Background()
	for round := range 20 {
		idk := fmt.Sprintf("card-%d", round)
		wsUser, pollUser := int64(1000+2*round), int64(1001+2*round)
		c := dial(t, g1.url(sale.ID))
		var wg sync.WaitGroup
		var pollErr error
		wg.Go(func() {
			_, pollErr = g2.room.Join(ctx, flashsale.Principal{UserID: pollUser, IdentityKey: idk}, sale.ID, testIP, nil, "")
		})
		c.join(e.identityToken(wsUser, idk))
		m := c.until("the join's answer", 5*time.Second, func(m msg) bool { return m.Type == "error" || m.Type == "status" })
		wg.Wait()
		wsPlaced := m.Type == "status"
		pollPlaced := pollErr == nil
		if wsPlaced == pollPlaced {
			t.Fatalf("round %d: WebSocket join %+v, polling join %v: want exactly one place for the key", round, m, pollErr)
		}
		if !wsPlaced && m.Error != "DUPLICATE_IDENTITY" {
			t.Fatalf("round %d: WebSocket join refused %+v, want DUPLICATE_IDENTITY", round, m)
		}
		if !pollPlaced && flashsale.ErrorCode(pollErr) != flashsale.CodeDuplicateIdentity {
			t.Fatalf("round %d: polling join refused %v, want DUPLICATE_IDENTITY", round, pollErr)
		}
		holder := pollUser
		if wsPlaced {
			holder = wsUser
		}
		if _, err := g2.room.Join(ctx, flashsale.Principal{UserID: holder, IdentityKey: idk}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatalf("round %d: the key's holder joins again: %v", round, err)
		}
	}
	for i, p := range []flashsale.Principal{{UserID: 1}, {UserID: 2}, {UserID: 3, IdentityKey: "another"}} {
		if _, err := g1.room.Join(ctx, p, sale.ID, testIP, nil, ""); err != nil {
			t.Fatalf("join %d (%+v): %v", i, p, err)
		}
	}
}

// TestUnansweredPingCloses: a connection that answers no ping within
// IdleTimeout/2 is closed; one that answers stays open, though a tick's
// pings share one deadline.
func TestUnansweredPingCloses(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 24, e.clock.Now().Add(time.Hour), 1, 100))
	// A ping slot every 10 ticks (200 ms), 200 ms to answer.
	g := e.newGateway(Config{Tick: 20 * time.Millisecond, IdleTimeout: 400 * time.Millisecond}, nil)
	live, silent := dial(t, g.url(sale.ID)), dial(t, g.url(sale.ID))
	live.join(e.token(1))
	live.untilState(StatePrequeue)
	silent.join(e.token(2))
	silent.untilState(StatePrequeue)
	// The live client reads on, so its library answers the pings; the
	// silent one reads nothing more, so it answers none.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := live.read(hangBound); err != nil {
				return
			}
		}
	}()
	conns := func() int {
		g.room.mu.Lock()
		defer g.room.mu.Unlock()
		return len(g.room.conns)
	}
	eventually(t, "the silent connection closed", hangBound, func() bool { return conns() == 1 })
	sent := g.pings(t, "sent")
	g.waitTicks(t, 30) // three more ping slots
	if n, more := conns(), g.pings(t, "sent")-sent; n != 1 || more < 2 {
		t.Errorf("%d connections open after %v more pings; want the live one, pinged on", n, more)
	}
	_ = live.ws.CloseNow()
	<-done
}
