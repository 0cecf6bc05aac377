package waitroom

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// TestWaitFigures: a percentile is the bound of the bucket its rank falls
// in, kept within the shortest and longest wait seen.
func TestWaitFigures(t *testing.T) {
	tests := []struct {
		name   string
		waits  map[int]int64 // bucket → count
		lo, hi int64
		want   flashsale.WaitFigures
	}{
		{"none", nil, -1, -1, flashsale.WaitFigures{}},
		{"one", map[int]int64{2: 1}, 700, 700, flashsale.WaitFigures{Count: 1, MinMs: 700, P50Ms: 700, P90Ms: 700, P99Ms: 700, MaxMs: 700}},
		{"spread", map[int]int64{0: 50, 3: 40, 5: 9, 7: 1}, 10, 25_000,
			flashsale.WaitFigures{Count: 100, MinMs: 10, P50Ms: 250, P90Ms: 2_000, P99Ms: 10_000, MaxMs: 25_000}},
		{"overflow", map[int]int64{waitBuckets - 1: 3}, 4_000_000, 5_000_000,
			flashsale.WaitFigures{Count: 3, MinMs: 4_000_000, P50Ms: 5_000_000, P90Ms: 5_000_000, P99Ms: 5_000_000, MaxMs: 5_000_000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h [waitBuckets]int64
			for b, n := range tt.waits {
				h[b] = n
			}
			if got := waitFigures(&h, tt.lo, tt.hi); got != tt.want {
				t.Errorf("waitFigures = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestTally: an unchanged queue makes no row, a failed write leaves the
// rows dirty, and a written past minute is forgotten.
func TestTally(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 18, 0, 10, 0, time.UTC)
	tl := newTally()
	tl.queue(1, t0, queueState{Seq: 3, N: -1, Serving: 0})
	tl.waited(1, t0, t0.UnixMilli()-1_500, t0.UnixMilli()) // 1.5 s: the 2 s bucket
	tl.waited(1, t0, t0.UnixMilli(), t0.UnixMilli()-5_001) // admitted before this join: not counted
	tl.refused(1, t0, RuleBlocklist)
	tl.waited(1, t0, t0.UnixMilli(), t0.UnixMilli()-200) // recorded by the tick that began before the join: 0
	rows := tl.dirty()
	if len(rows) != 1 {
		t.Fatalf("dirty = %d rows, want 1", len(rows))
	}
	m := rows[0].m
	if m.seq != 3 || m.prequeue != -1 || m.waits[0] != 1 || m.waits[3] != 1 || m.waitMin != 0 || m.waitMax != 1_500 || m.refusals[RuleBlocklist] != 1 {
		t.Fatalf("row = %+v", m)
	}
	// Not written: the next flush finds it again. Written: clean.
	if len(tl.dirty()) != 1 {
		t.Fatal("an unwritten row was lost")
	}
	tl.written(rows, t0)
	if len(tl.dirty()) != 0 {
		t.Fatal("a written row is still dirty")
	}
	// The same reading a minute later makes nothing; a new one makes a
	// row starting from the last reading, and the old minute is forgotten.
	t1 := t0.Add(time.Minute)
	tl.queue(1, t1, queueState{Seq: 3, N: -1})
	if len(tl.dirty()) != 0 {
		t.Fatal("an unchanged queue made a row")
	}
	tl.held(1, t1, 2)
	rows = tl.dirty()
	if len(rows) != 1 || rows[0].m.seq != 3 || rows[0].m.holds != 2 {
		t.Fatalf("rows = %+v", rows)
	}
	tl.written(rows, t1)
	if len(tl.rows) != 1 {
		t.Errorf("%d rows kept, want the current minute's only", len(tl.rows))
	}
}

// TestPGReport: two gateways write the same sale's minutes, one of them
// twice (a retry); the read sums the counts, takes the largest queue
// readings, carries the totals through a minute nobody wrote, and
// computes the percentiles from the summed buckets.
func TestPGReport(t *testing.T) {
	p := NewPGReport(testenv.Postgres(t))
	ctx := context.Background()
	const sale = 41
	m0 := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	row := func(minute time.Time, seq, serving, n, holds int64, refusals map[string]int64, waitsMs ...int64) reportRow {
		r := reportRow{key: tallyKey{sale, minute.Unix()}, m: minuteTally{seq: seq, serving: serving, prequeue: n, holds: holds,
			refusals: refusals, waitMin: -1, waitMax: -1}}
		tl := newTally()
		for _, w := range waitsMs {
			tl.waited(sale, minute, 1, 1+w)
		}
		for _, tm := range tl.rows {
			r.m.waits, r.m.waitMin, r.m.waitMax = tm.waits, tm.waitMin, tm.waitMax
		}
		return r
	}
	a := []reportRow{
		row(m0, 10, 4, 8, 0, map[string]int64{RuleBlocklist: 1}, 100, 200, 300, 400),
		row(m0.Add(2*time.Minute), 12, 12, 8, 0, nil, 1_200),
	}
	b := []reportRow{
		row(m0, 9, 6, 8, 0, map[string]int64{RuleBlocklist: 2, RuleIdentity: 1}, 3_000),
	}
	if err := p.save(ctx, "gw-a", a); err != nil {
		t.Fatal(err)
	}
	if err := p.save(ctx, "gw-a", a); err != nil { // a retry changes nothing
		t.Fatal(err)
	}
	if err := p.save(ctx, "gw-b", b); err != nil {
		t.Fatal(err)
	}
	rep, err := p.RoomReport(ctx, sale)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Joined != 12 || rep.Admitted != 12 || rep.PreQueue != 8 || rep.Waiting != 0 {
		t.Errorf("totals = %+v", rep)
	}
	if want := map[string]int64{RuleBlocklist: 3, RuleIdentity: 1}; fmt.Sprint(rep.Refusals) != fmt.Sprint(want) {
		t.Errorf("refusals = %v, want %v", rep.Refusals, want)
	}
	// Six waits: 100, 200, 300, 400 (the 250 and 500 buckets), 1 200 and
	// 3 000: p50 is the 3rd (500), p90 and p99 the 6th (the 5 s bucket's
	// bound, kept at the longest, 3 000).
	if want := (flashsale.WaitFigures{Count: 6, MinMs: 100, P50Ms: 500, P90Ms: 3_000, P99Ms: 3_000, MaxMs: 3_000}); rep.Wait != want {
		t.Errorf("wait = %+v, want %+v", rep.Wait, want)
	}
	if len(rep.Minutes) != 3 {
		t.Fatalf("minutes = %+v, want 3 (one filled in)", rep.Minutes)
	}
	first, gap, last := rep.Minutes[0], rep.Minutes[1], rep.Minutes[2]
	if first.Joins != 10 || first.Admitted != 6 || first.Waiting != 4 || first.Wait.Count != 5 {
		t.Errorf("first minute = %+v", first)
	}
	if !gap.At.Equal(m0.Add(time.Minute)) || gap.Joined != 10 || gap.Joins != 0 || gap.Admitted != 6 {
		t.Errorf("filled minute = %+v", gap)
	}
	if last.Joins != 2 || last.Admissions != 6 || last.Joined != 12 || last.Wait.P50Ms != 1_200 {
		t.Errorf("last minute = %+v", last)
	}
	if empty, err := p.RoomReport(ctx, sale+1); err != nil || empty.Joined != 0 || empty.PreQueue != -1 || len(empty.Minutes) != 0 {
		t.Errorf("a sale never seen = %+v, %v", empty, err)
	}
}

// TestReportWrittenOnStop: a room whose periodic write never comes writes
// its figures when it stops, after its other loops: the joins its tick
// saw and a refusal the gateway told it of.
func TestReportWrittenOnStop(t *testing.T) {
	e := newEnv(t)
	pool := testenv.Postgres(t)
	sale := e.addSale(newSale(t, 51, e.clock.Now().Add(-time.Second), 1000, 10))
	cfg := Config{Report: NewPGReport(pool), ReportEvery: time.Hour}
	e.testDefaults(&cfg)
	r := New(cfg, e.rdb, e.sales, e.stock, e.access, e.signer, nil, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	g := &gateway{room: r}
	g.joinUsers(t, sale.ID, 3)
	r.Refused(sale.ID, "perUser")
	// The tick reads the queue with the three tickets.
	eventually(t, "the tick to see three joins", hangBound, func() bool {
		r.tally.mu.Lock()
		defer r.tally.mu.Unlock()
		return r.tally.last[sale.ID].Seq == 3
	})
	if rep, err := cfg.Report.RoomReport(context.Background(), sale.ID); err != nil || len(rep.Minutes) != 0 {
		t.Fatalf("report before the stop = %+v, %v; want nothing written yet", rep, err)
	}
	cancel()
	<-done
	rep, err := cfg.Report.RoomReport(context.Background(), sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Joined != 3 || rep.Refusals["perUser"] != 1 {
		t.Errorf("report after the stop = %+v, want 3 joined and one perUser refusal", rep)
	}
}

// TestReportWithoutStore: a room with no Config.Report drops its figures
// at each write instead of keeping them.
func TestReportWithoutStore(t *testing.T) {
	e := newEnv(t)
	cfg := Config{}
	e.testDefaults(&cfg)
	r := New(cfg, e.rdb, e.sales, e.stock, e.access, e.signer, nil, nil, nil)
	r.Refused(7, "perUser")
	e.clock.Advance(time.Minute)
	r.flushReport(context.Background())
	if n := len(r.tally.rows); n != 0 {
		t.Errorf("%d rows kept without a store, want 0", n)
	}
}
