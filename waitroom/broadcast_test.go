package waitroom

import (
	"context"
	"encoding/json"
	"maps"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/lua"
)

// The steps of broadcast, each on its own. The rooms here are not run:
// statuses queue on connections that no writer sends, where the tests
// read them.

// stepRoom is a Room of env that is not run.
func stepRoom(e *env, cfg Config) *Room { return stepGateway(e, cfg).room }

// stepGateway is stepRoom with its metrics' registry (no server).
func stepGateway(e *env, cfg Config) *gateway {
	e.testDefaults(&cfg)
	reg := prometheus.NewRegistry()
	return &gateway{room: New(cfg, e.rdb, e.sales, e.stock, e.access, e.signer, nil, nil, reg), reg: reg}
}

// stepSaleRoom is r's room of sale with the queue state st.
func stepSaleRoom(r *Room, sale *flashsale.Sale, st queueState) *saleRoom {
	sr := r.saleRoom(sale.ID, true)
	sr.mu.Lock()
	defer sr.mu.Unlock()
	sr.setSale(sale)
	sr.st = st
	return sr
}

// stepConn adds a connection of user at place to sr.
func stepConn(r *Room, sr *saleRoom, user, place int64) *conn {
	c := &conn{r: r, sr: sr, user: user, ticket: place, place: place, seq: uint64(user)}
	sr.mu.Lock()
	sr.addConn(c)
	sr.mu.Unlock()
	return c
}

// pending is the status queued on c (ok false: none), and whether an
// admitted message goes with it.
func pending(c *conn) (v view, adm, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pend, c.pendAdm != nil, c.hasPend
}

func TestPlanTick(t *testing.T) {
	e := newEnv(t)
	opens := e.clock.Now()
	const tick = 10 * time.Millisecond
	cases := []struct {
		name             string
		cfg              Config
		at               time.Duration // after the opening
		regular          bool
		queue            bool
		competing        int64
		lastBeat         time.Duration // before now (0: never)
		hold, busy, beat bool
		wantTTL          time.Duration
	}{
		{name: "quiet regular tick, beat due", cfg: Config{AdmittedGrace: 4 * time.Second}, at: time.Minute, regular: true,
			beat: true, wantTTL: 5 * time.Minute},
		{name: "beat not due yet", cfg: Config{AdmittedGrace: 4 * time.Second}, at: time.Minute, regular: true,
			lastBeat: 500 * time.Millisecond, wantTTL: 5 * time.Minute},
		{name: "no beat on an opening's own tick", cfg: Config{AdmittedGrace: 4 * time.Second}, at: time.Minute,
			wantTTL: 5 * time.Minute},
		{name: "no beat in queue order", cfg: Config{AdmittedGrace: 4 * time.Second}, at: time.Minute, regular: true, queue: true,
			wantTTL: 5 * time.Minute},
		{name: "opening hold", cfg: Config{OpeningHold: 3 * time.Second, AdmittedGrace: -1}, at: time.Second, regular: true,
			hold: true, busy: true, wantTTL: 5 * time.Minute},
		{name: "after the opening hold", cfg: Config{OpeningHold: 3 * time.Second, AdmittedGrace: -1}, at: 3 * time.Second, regular: true,
			wantTTL: 5 * time.Minute},
		{name: "competing requests", cfg: Config{AdmittedGrace: -1}, at: time.Minute, regular: true, competing: 1000,
			busy: true, wantTTL: 5 * time.Minute},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.Tick = tick
			r := stepRoom(e, c.cfg)
			sale := newSale(t, int64(100+i), opens, 10, 5)
			if c.queue {
				sale.Allocation, sale.ClaimWindow = flashsale.AllocationQueue, 5*time.Minute
			}
			sr := stepSaleRoom(r, sale, queueState{})
			now := opens.Add(c.at)
			if c.lastBeat > 0 {
				sr.lastBeat = now.Add(-c.lastBeat)
			}
			before := sr.lastBeat
			sr.mu.Lock()
			p := r.planTick(sr, now, 7, c.regular, c.competing)
			sr.mu.Unlock()
			if p.hold != c.hold || p.busy != c.busy || p.beat != c.beat {
				t.Errorf("hold, busy, beat: got %v, %v, %v; want %v, %v, %v", p.hold, p.busy, p.beat, c.hold, c.busy, c.beat)
			}
			if got, want := p.ttlMs, c.wantTTL.Milliseconds(); got != want {
				t.Errorf("ttlMs: got %d, want %d", got, want)
			}
			// A ping every IdleTimeout/2 (60 s by default), a paced status
			// at most every StatusEvery (2 s), in 10 ms ticks.
			if p.pingSlots != 3000 || p.statusSlots != 200 {
				t.Errorf("slots: got ping %d, status %d; want 3000, 200", p.pingSlots, p.statusSlots)
			}
			if p.opens != opens.UnixMilli() || p.queue != c.queue || p.tick != 7 || p.regular != c.regular {
				t.Errorf("plan %+v: opening, queue, tick or regular not the tick's", p)
			}
			if want := map[bool]time.Time{true: now, false: before}[c.beat]; !sr.lastBeat.Equal(want) {
				t.Errorf("lastBeat: got %v, want %v (recorded only with a beat)", sr.lastBeat, want)
			}
		})
	}
}

func TestPingDue(t *testing.T) {
	cases := []struct {
		name            string
		regular, busy   bool
		seq             uint64
		waited          bool
		want            pingVerdict
		wantWaitedAfter bool
	}{
		{name: "not a regular tick", regular: false, seq: 3, want: pingNone},
		{name: "another slot", regular: true, seq: 4, want: pingNone},
		{name: "its slot", regular: true, seq: 3, want: pingSend},
		{name: "its slot, busy", regular: true, busy: true, seq: 3, want: pingWait, wantWaitedAfter: true},
		{name: "its slot, busy, waited once", regular: true, busy: true, seq: 3, waited: true, want: pingSend},
		{name: "its slot after a wait, quiet", regular: true, seq: 3, waited: true, want: pingSend},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := tickPlan{tick: 13, regular: c.regular, busy: c.busy, pingSlots: 10}
			cn := &conn{seq: c.seq, pingWaited: c.waited}
			if got := p.pingDue(cn); got != c.want {
				t.Errorf("pingDue: got %v, want %v", got, c.want)
			}
			if cn.pingWaited != c.wantWaitedAfter {
				t.Errorf("pingWaited after: got %v, want %v", cn.pingWaited, c.wantWaitedAfter)
			}
		})
	}
}

func TestPresent(t *testing.T) {
	now := time.UnixMilli(1_900_000_000_000)
	cases := []struct {
		name       string
		beat       bool
		admittedAt int64
		bought     bool
		want       bool
	}{
		{name: "admitted, beat due", beat: true, admittedAt: now.UnixMilli() - 1000, want: true},
		{name: "no beat", admittedAt: now.UnixMilli() - 1000},
		{name: "not admitted", beat: true},
		{name: "bought", beat: true, admittedAt: now.UnixMilli() - 1000, bought: true},
		{name: "admission expired", beat: true, admittedAt: now.UnixMilli() - 60_000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := tickPlan{now: now, beat: c.beat, ttlMs: 60_000}
			if got := p.present(&conn{admittedAt: c.admittedAt, bought: c.bought}); got != c.want {
				t.Errorf("present: got %v, want %v", got, c.want)
			}
		})
	}
}

func TestStatusDue(t *testing.T) {
	now := time.UnixMilli(1_900_000_000_000)
	out := newItemsOut([]int64{7})
	waiting := func(pos int64) view { return view{state: StateWaiting, position: pos} }
	cases := []struct {
		name       string
		c          *conn
		v          view
		hold       bool
		canRequeue bool
		want       due
	}{
		{name: "reached by the cursor", v: view{state: StateAdmitted}, want: dueAdmit},
		{name: "admission expired", c: &conn{admittedAt: now.UnixMilli() - 60_000, last: view{state: StateAdmitted}},
			v: view{state: StateAdmitted}, canRequeue: true, want: dueRequeue},
		{name: "admission expired, requeues at their bound", c: &conn{admittedAt: now.UnixMilli() - 60_000, last: view{state: StateAdmitted}},
			v: view{state: StateAdmitted}, want: dueNothing},
		{name: "admission expired after buying", c: &conn{admittedAt: now.UnixMilli() - 60_000, bought: true, last: view{state: StateAdmitted}},
			v: view{state: StateAdmitted}, canRequeue: true, want: dueNothing},
		{name: "admitted, alive", c: &conn{admittedAt: now.UnixMilli() - 1000, last: view{state: StateAdmitted}},
			v: view{state: StateAdmitted}, canRequeue: true, want: dueNothing},
		{name: "unchanged", c: &conn{last: waiting(4)}, v: waiting(4), want: dueNothing},
		{name: "entering WAITING", c: &conn{last: view{state: StatePrequeue}}, v: waiting(4), want: dueEntering},
		{name: "moved, too soon", c: &conn{last: waiting(5), lastTick: 95}, v: waiting(4), want: dueNothing},
		{name: "moved", c: &conn{last: waiting(5), lastTick: 90}, v: waiting(4), want: dueMoved},
		{name: "moved in the opening hold", c: &conn{last: waiting(5), lastTick: 90}, v: waiting(4), hold: true, want: dueHeld},
		{name: "chosen item sold out", c: &conn{last: view{state: StateWaiting, position: 5, chosen: 7}, lastTick: 99},
			v: view{state: StateWaiting, position: 5, chosen: 7, out: out}, want: dueNow},
		{name: "sold out", c: &conn{last: waiting(5)}, v: view{state: StateSoldOut}, want: dueNow},
		{name: "paused", c: &conn{last: waiting(5)}, v: view{state: StatePaused}, want: dueNow},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := tickPlan{now: now, tick: 100, ttlMs: 60_000, hold: c.hold, statusSlots: 10}
			cn := c.c
			if cn == nil {
				cn = &conn{}
			}
			if got := p.statusDue(cn, c.v, c.canRequeue); got != c.want {
				t.Errorf("statusDue: got %v, want %v", got, c.want)
			}
		})
	}
}

func TestSendDue(t *testing.T) {
	e := newEnv(t)
	r := stepRoom(e, Config{})
	cases := []struct {
		name         string
		budget       int
		wantSent     []int64 // places, entering then moved
		wantDeferred int
	}{
		{name: "no cap", budget: -1, wantSent: []int64{1, 3, 0, 2}},
		{name: "no budget", budget: 0, wantDeferred: 4},
		{name: "one: the front of the entering", budget: 1, wantSent: []int64{1}, wantDeferred: 3},
		{name: "three: the entering, then the front moved", budget: 3, wantSent: []int64{1, 3, 0}, wantDeferred: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := tickPlan{tick: 42, opens: 1}
			mk := func(place int64) dueStatus {
				return dueStatus{c: &conn{r: r, place: place}, v: view{state: StateWaiting, position: place}}
			}
			entering := []dueStatus{mk(3), mk(1)}
			moved := []dueStatus{mk(2), mk(0)}
			all := []dueStatus{entering[0], entering[1], moved[0], moved[1]}
			if got := sendDue(&p, c.budget, entering, moved); got != c.wantDeferred {
				t.Errorf("deferred: got %d, want %d", got, c.wantDeferred)
			}
			sent := map[int64]bool{}
			for _, pl := range c.wantSent {
				sent[pl] = true
			}
			for _, d := range all {
				v, _, ok := pending(d.c)
				if ok != sent[d.c.place] {
					t.Errorf("place %d: queued %v, want %v", d.c.place, ok, sent[d.c.place])
				}
				if ok && (v != d.v || d.c.last != d.v || d.c.lastTick != 42) {
					t.Errorf("place %d: queued %+v, last %+v at tick %d; want %+v at tick 42", d.c.place, v, d.c.last, d.c.lastTick, d.v)
				}
			}
		})
	}
}

func TestKeepScratch(t *testing.T) {
	sr := &saleRoom{}
	entering := append(make([]dueStatus, 0, 8), dueStatus{c: &conn{}}, dueStatus{c: &conn{}})
	moved := append(make([]dueStatus, 0, 4), dueStatus{c: &conn{}})
	sr.keepScratch(entering, moved)
	if len(sr.entering) != 0 || cap(sr.entering) != 8 || len(sr.moved) != 0 || cap(sr.moved) != 4 {
		t.Errorf("scratch: len %d cap %d, len %d cap %d; want empty with capacities 8 and 4",
			len(sr.entering), cap(sr.entering), len(sr.moved), cap(sr.moved))
	}
	if entering[0].c != nil || entering[1].c != nil || moved[0].c != nil {
		t.Error("scratch still holds connections: they would outlive their sale room")
	}
}

// TestSweep: one connection of each kind, in a sale whose cursor is at
// place 2 on a tick whose presence beat and ping slots are due.
func TestSweep(t *testing.T) {
	e := newEnv(t)
	r := stepRoom(e, Config{Tick: 10 * time.Millisecond, AdmittedGrace: 4 * time.Second})
	now := e.clock.Now()
	sale := e.addSale(newSale(t, 120, now.Add(-time.Minute), 10, 5))
	sr := stepSaleRoom(r, sale, queueState{Seq: 10, N: 0, Serving: 2})
	ttl := r.ttl(sale)
	admit := stepConn(r, sr, 1, 0) // reached, no admission yet
	expired := stepConn(r, sr, 2, 1)
	expired.admittedAt, expired.last = now.Add(-ttl).UnixMilli(), view{state: StateAdmitted}
	entering := stepConn(r, sr, 3, 3) // first status
	moved := stepConn(r, sr, 4, 4)
	moved.last, moved.lastTick = view{state: StateWaiting, position: 5}, 0
	unplaced := stepConn(r, sr, 5, -1) // ticket 5: place 5 once looked up
	unplaced.ticket = 5
	unplaced.last, unplaced.lastTick = view{state: StateWaiting, position: 3}, 1000
	sr.mu.Lock()
	p := r.planTick(sr, now, 1000, true, 0)
	p.pingSlots = 1 // every connection's slot
	s := r.sweep(sr, &p)
	sr.mu.Unlock()
	if len(s.admit) != 1 || s.admit[0] != admit {
		t.Errorf("admit: got %d connections, want user 1's", len(s.admit))
	}
	if len(s.expired) != 1 || s.expired[0] != expired {
		t.Errorf("expired: got %d connections, want user 2's", len(s.expired))
	}
	if len(s.entering) != 1 || s.entering[0].c != entering {
		t.Errorf("entering: got %d statuses, want user 3's", len(s.entering))
	}
	if len(s.moved) != 1 || s.moved[0].c != moved {
		t.Errorf("moved: got %d statuses, want user 4's", len(s.moved))
	}
	if got, want := s.waiting, 3; got != want {
		t.Errorf("waiting: got %d, want %d (users 3, 4 and 5)", got, want)
	}
	if got, want := len(s.ping), 5; got != want {
		t.Errorf("pings: got %d, want %d", got, want)
	}
	if len(s.present) != 0 {
		t.Errorf("present: got %v, want none (user 2's admission expired)", s.present)
	}
	if unplaced.place != 5 {
		t.Errorf("user 5's place: got %d, want 5", unplaced.place)
	}
	for _, c := range []*conn{admit, expired, entering, moved, unplaced} {
		if _, _, ok := pending(c); ok {
			t.Errorf("user %d: a status queued by the sweep, want none (paced or unchanged)", c.user)
		}
	}
}

// TestAfterSweep: an admitted connection is marked present in Redis, an
// expired admission of a shopper who bought stays ADMITTED (a real
// reservation), and passed-by pings are counted.
func TestAfterSweep(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	g := stepGateway(e, Config{})
	r := g.room
	now := e.clock.Now()
	sale := e.addSale(newSale(t, 121, now.Add(-time.Minute), 10, 5))
	sr := stepSaleRoom(r, sale, queueState{Seq: 10, N: 0, Serving: 2})
	st := redisstock.New(e.rdb)
	item := sale.Items[0].ID
	if err := st.Load(ctx, sale.ID, map[int64]int64{item: 5}); err != nil {
		t.Fatal(err)
	}
	if err := st.Reserve(ctx, sale.ID, item, 2, "order-2", now); err != nil {
		t.Fatal(err)
	}
	// The cursor passed places 0 and 1: user 1's presence mark writes its
	// admission record.
	if err := e.rdb.HSet(ctx, lua.QueueKey(sale.ID, keyState), fieldServing, 2).Err(); err != nil {
		t.Fatal(err)
	}
	buyer := stepConn(r, sr, 2, 1)
	buyer.admittedAt = now.Add(-time.Hour).UnixMilli()
	s := sweepOut{expired: []*conn{buyer}, present: []heldConn{{user: 1, place: 0}}, waited: 2}
	r.afterSweep(ctx, sr, &s, now)
	if !buyer.bought {
		t.Error("the buyer whose admission expired is not known to have bought")
	}
	if _, err := e.rdb.ZScore(ctx, lua.QueueKey(sale.ID, keyPresence), "1").Result(); err != nil {
		t.Errorf("user 1's presence mark: %v", err)
	}
	if got := g.pings(t, "waited"); got != 2 {
		t.Errorf("pings waited: got %v, want 2", got)
	}
}

// TestAdmitConns: the admissions are recorded in Redis and each admitted
// connection gets ADMITTED with its admitted message.
func TestAdmitConns(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	r := stepRoom(e, Config{})
	now := e.clock.Now()
	sale := e.addSale(newSale(t, 122, now.Add(-time.Minute), 10, 5))
	sr := stepSaleRoom(r, sale, queueState{Seq: 10, N: 0, Serving: 2})
	// The cursor passed places 0 and 1, as the leader's tick moves it.
	if err := e.rdb.HSet(ctx, lua.QueueKey(sale.ID, keyState), fieldServing, 2).Err(); err != nil {
		t.Fatal(err)
	}
	conns := []*conn{stepConn(r, sr, 1, 0), stepConn(r, sr, 2, 1)}
	p := tickPlan{now: now, tick: 5, opens: sale.StartsAt.UnixMilli()}
	r.admitConns(ctx, sr, &p, conns)
	for _, c := range conns {
		if c.admittedAt != now.UnixMilli() {
			t.Errorf("user %d: admittedAt %d, want %d", c.user, c.admittedAt, now.UnixMilli())
		}
		v, adm, ok := pending(c)
		if !ok || v.state != StateAdmitted || !adm {
			t.Errorf("user %d: queued %+v (admitted message %v, any %v), want ADMITTED with its message", c.user, v, adm, ok)
		}
	}
	n, err := e.rdb.HLen(ctx, lua.QueueKey(sale.ID, keyAdmitted)).Result()
	if err != nil || n != 2 {
		t.Errorf("admission records: %d, %v; want 2", n, err)
	}
}

func TestApplyAdmissions(t *testing.T) {
	e := newEnv(t)
	r := stepRoom(e, Config{})
	now := e.clock.Now()
	at := now.UnixMilli()
	cases := []struct {
		name       string
		queue      bool
		chosen     int64
		admittedAt int64
		at, held   int64
		wantState  string // "" for nothing queued
		wantAdm    bool
		wantAt     int64
	}{
		{name: "admitted", at: at, wantState: StateAdmitted, wantAdm: true, wantAt: at},
		{name: "admitted with a held item", queue: true, at: at, held: 7, wantState: StateAdmitted, wantAdm: true, wantAt: at},
		{name: "no record", wantAt: 0},
		{name: "admitted before", admittedAt: at - 1000, at: at, wantAt: at - 1000},
		{name: "passed over for the chosen item", queue: true, chosen: 7, wantState: StateWaiting},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sale := newSale(t, int64(130+i), now.Add(-time.Minute), 10, 5)
			if c.queue {
				sale.Allocation, sale.ClaimWindow = flashsale.AllocationQueue, 5*time.Minute
			}
			sr := stepSaleRoom(r, e.addSale(sale), queueState{Seq: 10, N: 0, Serving: 2})
			cn := stepConn(r, sr, 1, 0)
			cn.chosen, cn.admittedAt = c.chosen, c.admittedAt
			p := tickPlan{now: now, tick: 9, queue: c.queue, opens: sale.StartsAt.UnixMilli()}
			sr.mu.Lock()
			r.applyAdmissions(sr, &p, []*conn{cn}, []int64{c.at}, []int64{c.held})
			sr.mu.Unlock()
			v, adm, ok := pending(cn)
			if got := map[bool]string{true: v.state}[ok]; got != c.wantState || adm != c.wantAdm {
				t.Errorf("queued %q (admitted message %v), want %q (%v)", got, adm, c.wantState, c.wantAdm)
			}
			if cn.admittedAt != c.wantAt {
				t.Errorf("admittedAt: got %d, want %d", cn.admittedAt, c.wantAt)
			}
			if cn.heldItem != map[bool]int64{true: c.held}[c.wantAdm] {
				t.Errorf("heldItem: got %d, want %d", cn.heldItem, c.held)
			}
			if c.chosen != 0 && v.chosen != c.chosen {
				t.Errorf("passed over: chosen %d in the status, want %d", v.chosen, c.chosen)
			}
		})
	}
}

// TestStillSweepPassesSettledWaitersBy: while nothing a view is computed
// from changes, a waiting connection owed nothing is not visited, still
// counted waiting and still pinged in its ping slot; one owed a paced
// status, or one whose choice changed, is visited every tick; a cursor
// that moves, or a blocklist that changes, makes the next tick visit
// everyone.
func TestStillSweepPassesSettledWaitersBy(t *testing.T) {
	e := newEnv(t)
	r := stepRoom(e, Config{Tick: 10 * time.Millisecond, IdleTimeout: 2 * time.Second}) // 100 ping slots
	blocks := &stepBlocker{gen: 1}
	r.guard = blocks
	now := e.clock.Now()
	sale := e.addSale(newSale(t, 121, now.Add(-time.Minute), 10, 5))
	sr := stepSaleRoom(r, sale, queueState{Seq: 20, N: 0, Serving: 2})
	var settled []*conn
	for u := int64(10); u < 18; u++ {
		settled = append(settled, stepConn(r, sr, u, u))
	}
	owed := stepConn(r, sr, 30, 9)
	chose := stepConn(r, sr, 31, 19)
	sweep := func(tick uint64) (sweepOut, tickPlan) {
		sr.mu.Lock()
		defer sr.mu.Unlock()
		p := r.planTick(sr, now, tick, true, 0)
		p.statusSlots = 1000 // a changed position is paced: owed, not sent
		s := r.sweep(sr, &p)
		sendDue(&p, -1, s.entering, s.moved)
		return s, p
	}
	marks := func() map[*conn]connMark {
		sr.mu.Lock()
		defer sr.mu.Unlock()
		return maps.Clone(sr.conns)
	}
	// The first ticks visit everyone: each gets its first status (sent
	// after the sweep), then is settled.
	if _, p := sweep(1); p.still {
		t.Fatal("the first tick is still")
	}
	if _, p := sweep(2); !p.still {
		t.Fatal("tick 2 is not still: nothing changed")
	}
	for c, m := range marks() {
		if !m.settled {
			t.Errorf("user %d not settled after two ticks", c.user)
		}
	}
	sr.mu.Lock()
	// A view changed outside the sweep (a choice) unsettles its
	// connection; here one whose new status the pacing then puts off.
	owed.last.position++
	sr.unsettle(owed)
	sr.unsettle(chose)
	// A settled connection's recorded view made stale behind the sweep's
	// back: a visit would find it owed a status and unsettle it, so its
	// mark shows whether it was visited.
	stale := settled[3]
	stale.last.position++
	sr.mu.Unlock()

	s, p := sweep(3)
	if !p.still || s.waiting != 10 {
		t.Errorf("tick 3: still %v, waiting %d; want still and all 10 waiting (passed-by ones too)", p.still, s.waiting)
	}
	m := marks()
	if !m[stale].settled {
		t.Error("a still tick visited a settled connection")
	}
	if m[owed].settled {
		t.Error("a connection owed a status is settled")
	}
	if !m[chose].settled {
		t.Error("the chooser is not settled again after its visit")
	}
	if _, p := sweep(4); !p.still || marks()[owed].settled {
		t.Error("a connection owed a status is passed by while the pacing holds it")
	}

	// Pings on still ticks: the slot's settled connection (seq 12), and
	// an unsettled one in its visit (owed, seq 30); nobody else.
	for _, c := range []struct {
		tick uint64
		want *conn
	}{{112, settled[2]}, {130, owed}} {
		s, p := sweep(c.tick)
		if !p.still || len(s.ping) != 1 || s.ping[0] != c.want {
			t.Errorf("tick %d: still %v, pings %d; want a still tick pinging user %d alone", c.tick, p.still, len(s.ping), c.want.user)
		}
	}

	// A blocklist change: the next tick visits everyone and kicks the
	// blocked; once every connection was checked, ticks are still again.
	blocks.set(settled[5].user)
	s, p = sweep(5)
	if p.still || len(s.kick) != 1 || s.kick[0] != settled[5] {
		t.Errorf("after a blocklist change: still %v, %d kicked; want a full sweep kicking user %d", p.still, len(s.kick), settled[5].user)
	}
	if marks()[stale].settled {
		t.Error("the full sweep did not visit the stale connection")
	}
	if _, p := sweep(6); !p.still {
		t.Error("tick 6 is not still: the blocklist was checked")
	}
	sr.mu.Lock()
	sr.st.Serving = 3 // the cursor moves
	sr.mu.Unlock()
	if _, p := sweep(7); p.still {
		t.Error("tick 7 is still after the cursor moved")
	}
}

// TestStillSweepSettlesSoldOut: shoppers told SOLD_OUT, who stay for
// units that come back, settle like waiting ones (no visit while the
// sale is still, though the admission rate moves: no SOLD_OUT view reads
// it) and are not counted waiting; stock coming back makes the next tick
// visit them.
func TestStillSweepSettlesSoldOut(t *testing.T) {
	e := newEnv(t)
	r := stepRoom(e, Config{Tick: 10 * time.Millisecond})
	now := e.clock.Now()
	sale := e.addSale(newSale(t, 122, now.Add(-time.Minute), 10, 5))
	sr := stepSaleRoom(r, sale, queueState{Seq: 20, N: 0, Serving: 2})
	sr.mu.Lock()
	sr.soldOut = true
	sr.mu.Unlock()
	var conns []*conn
	for u := int64(10); u < 14; u++ {
		conns = append(conns, stepConn(r, sr, u, u))
	}
	sweep := func(tick uint64) (sweepOut, tickPlan) {
		sr.mu.Lock()
		defer sr.mu.Unlock()
		p := r.planTick(sr, now, tick, true, 0)
		s := r.sweep(sr, &p)
		sendDue(&p, -1, s.entering, s.moved)
		return s, p
	}
	// Admission stalled since the opening: the measured rate is the
	// average since the opening, which moves with every sample.
	sample := func() {
		sr.mu.Lock()
		defer sr.mu.Unlock()
		sr.samples[sr.nsample%rateSamples] = struct{ ms, serving int64 }{now.UnixMilli() + int64(sr.nsample)*250, 2}
		sr.nsample++
	}
	sample()
	sample()
	sweep(1)
	sample()
	s, p := sweep(2)
	if !p.still || s.waiting != 0 {
		t.Fatalf("tick 2: still %v, waiting %d; want still and none waiting (all sold out, the rate no input)", p.still, s.waiting)
	}
	sr.mu.Lock()
	for _, c := range conns {
		if !sr.conns[c].settled || c.last.state != StateSoldOut {
			t.Errorf("user %d: settled %v in %s; want settled, SOLD_OUT", c.user, sr.conns[c].settled, c.last.state)
		}
	}
	stale := conns[0]
	stale.last.position++ // a visit would find it owed a status
	sr.mu.Unlock()
	sample()
	sweep(3)
	sr.mu.Lock()
	if !sr.conns[stale].settled {
		t.Error("a still tick visited a settled SOLD_OUT connection")
	}
	sr.soldOut = false // units came back
	sr.mu.Unlock()
	s, p = sweep(4)
	if p.still || s.waiting != 4 {
		t.Errorf("after the stock came back: still %v, waiting %d; want a full sweep with all 4 waiting", p.still, s.waiting)
	}
	if s, p := sweep(5); !p.still || s.waiting != 4 {
		t.Errorf("tick 5: still %v, waiting %d; want still with all 4 counted waiting, settled", p.still, s.waiting)
	}
}

// stepBlocker blocks the users set, with a generation of its own.
type stepBlocker struct {
	mu    sync.Mutex
	gen   uint64
	users map[int64]bool
}

func (b *stepBlocker) set(users ...int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gen++
	b.users = map[int64]bool{}
	for _, u := range users {
		b.users[u] = true
	}
}

func (b *stepBlocker) Blocked(_ netip.Addr, user int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.users[user]
}

func (b *stepBlocker) BlocksGen() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen
}

func (b *stepBlocker) CheckJoin(context.Context, netip.Addr, int64, int64, json.RawMessage) (json.RawMessage, error) {
	return nil, nil
}
