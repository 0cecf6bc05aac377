package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// brokenInvariants lists the names of the invariants a report breaks.
func brokenInvariants(r *Report) []string {
	var out []string
	for _, c := range r.Invariants {
		if !c.OK && !c.Skipped {
			out = append(out, c.Name)
		}
	}
	return out
}

// TestRunFakeAcknowledgedRejectedOrLost: a server that acknowledges
// orders and then rejects or forgets them fails the run, with the counts
// and the order ids in the summary, though every other invariant holds
// (the units came back and sold again).
func TestRunFakeAcknowledgedRejectedOrLost(t *testing.T) {
	f := newFakeStackWith(t, false, fakeFaults{rejectFirst: 2, loseAfter: 2}, 1)
	cfg := fakeConfig(f)
	r, err := runFakeBroken(t, cfg, "acknowledged orders kept")
	sm := r.Summary
	if sm.AcknowledgedRejected != 2 || sm.AcknowledgedLost != 1 || sm.Acknowledged != 13 {
		t.Errorf("summary: %d acknowledged, %d rejected, %d lost; want 13, 2, 1", sm.Acknowledged, sm.AcknowledgedRejected, sm.AcknowledgedLost)
	}
	want := map[string][]string{
		"acknowledgedRejected": {"00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"},
		"acknowledgedLost":     {"00000000-0000-0000-0000-000000000003"},
	}
	for k, ids := range want {
		got := slices.Clone(sm.Examples[k])
		slices.Sort(got)
		if !slices.Equal(got, ids) {
			t.Errorf("examples %s = %v, want %v", k, got, ids)
		}
	}
	for _, e := range r.Ledger {
		if e.OrderID == want["acknowledgedLost"][0] && (e.APIStatus != "NOT_FOUND" || e.Final != FinalMissing) {
			t.Errorf("lost order in the ledger: %+v", e)
		}
	}
	if err != nil && !strings.Contains(err.Error(), "2 rejected") {
		t.Errorf("error %q does not give the count", err)
	}
}

// TestRunFakeServerError: a 500 fails the run (by route and status in
// the summary), and the shopper whose purchase got it looks its order
// up and buys again, so the sale still sells out.
func TestRunFakeServerError(t *testing.T) {
	f := newFakeStackWith(t, false, fakeFaults{fail500: 3}, 1)
	r, _ := runFakeBroken(t, fakeConfig(f), "no 5xx but 503 with Retry-After")
	if got := r.Summary.HTTP5xx.ByRoute["purchase 500"]; got != 3 || r.Summary.HTTP5xx.Total != 3 {
		t.Errorf("http5xx = %+v, want purchase 500 × 3", r.Summary.HTTP5xx)
	}
	if got := r.Steps[StepSaleOrder].Outcomes["404 NOT_FOUND"]; got < 3 {
		t.Errorf("sale order lookups %v, want a 404 after each 500", r.Steps[StepSaleOrder].Outcomes)
	}
	if r.Orders.Reserved != 10 || r.Orders.Sold != 10 {
		t.Errorf("orders = %+v, want 10 reserved and sold", r.Orders)
	}
}

// TestRunFakeLostAnswer: a purchase that reserved but whose answer was
// lost with its connection is found again with the sale's order lookup;
// the ledger lists it by that source, not as acknowledged, and the run
// passes.
func TestRunFakeLostAnswer(t *testing.T) {
	r := runFake(t, fakeFaults{dropAnswers: 3})
	sm := r.Summary
	if sm.OrdersBySource[SourceSaleOrder] != 3 || sm.OrdersBySource[SourcePurchase202] != 7 || sm.Acknowledged != 7 {
		t.Errorf("orders by source %v, %d acknowledged; want 3 found by the lookup and 7 × 202", sm.OrdersBySource, sm.Acknowledged)
	}
	if sm.NetworkErrors.Total < 3 {
		t.Errorf("network errors %+v, want the 3 lost answers", sm.NetworkErrors)
	}
	if r.Orders.Sold != 10 || r.Orders.Users != 10 {
		t.Errorf("orders = %+v, want 10 sold to 10 users", r.Orders)
	}
}

// TestRunFakeRoomBusy: a room that answers a join with error
// UNAVAILABLE (closed 1013, try again later) is joined again after the
// backoff, as the page does, and the run passes.
func TestRunFakeRoomBusy(t *testing.T) {
	r := runFake(t, fakeFaults{roomBusy: 20})
	if got := r.Steps[StepReconnect].Outcomes["error UNAVAILABLE"]; got != 20 {
		t.Errorf("reconnect outcomes %v, want 20 × error UNAVAILABLE", r.Steps[StepReconnect].Outcomes)
	}
	if got := r.Steps[StepJoin].Outcomes["PREQUEUE"]; got != 50 || r.Orders.Sold != 10 {
		t.Errorf("joins %v, sold %d: want all 50 in the room and 10 sold", r.Steps[StepJoin].Outcomes, r.Orders.Sold)
	}
}

// TestRunFakeStranded: shoppers still waiting at the end while units are
// left and the sale is open fail the run with the stranded units.
func TestRunFakeStranded(t *testing.T) {
	f := newFakeStackWith(t, false, fakeFaults{admitOnly: 5}, 1)
	cfg := fakeConfig(f)
	cfg.Duration, cfg.QuietTimeout = 6*time.Second, time.Second
	r, _ := runFakeBroken(t, cfg, "no stranded stock")
	sm := r.Summary
	if sm.StrandedUnits != 5 || sm.RemainingUnits != 5 || sm.WaitingRun != 45 || sm.WaitingAdmin != 45 {
		t.Errorf("summary: stranded %d, remaining %d, waiting %d (run) %d (admin); want 5, 5, 45, 45",
			sm.StrandedUnits, sm.RemainingUnits, sm.WaitingRun, sm.WaitingAdmin)
	}
	if r.Stopped != "duration" {
		t.Errorf("stopped %q, want duration", r.Stopped)
	}
}

// TestRunFakeStockBackWhileLingering: units that come back after the
// sell-out go to shoppers still on the sold-out page (lingering): the room
// admits them and they buy, so nothing is left stranded; without the
// linger nobody is there to buy them.
func TestRunFakeStockBackWhileLingering(t *testing.T) {
	f := newFakeStackWith(t, false, fakeFaults{stockBack: 3}, 1)
	cfg := fakeConfig(f)
	cfg.Linger = 3 * time.Second
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	f.mu.Lock()
	quantity := f.items[0].Quantity
	for _, it := range f.items[1:] {
		quantity += it.Quantity
	}
	f.mu.Unlock()
	if r.Orders.Sold != quantity || r.Summary.StrandedUnits != 0 {
		t.Errorf("sold %d of %d, stranded %d: want every unit given back sold", r.Orders.Sold, quantity, r.Summary.StrandedUnits)
	}
}

// TestRunFakeGatewayKilled: one of two gateways dies (its port refuses,
// its WebSockets and keep-alive connections close) before the opening,
// or in the middle of the admissions: its shoppers reconnect to the
// other with the same token, keep their place and buy (those already
// admitted buy and pay through the other); the run reads its figures
// through the other gateway and passes, with the failures counted as
// network errors, not 5xx.
func TestRunFakeGatewayKilled(t *testing.T) {
	for _, tc := range []struct {
		transport string
		killAt    time.Duration // from the opening
		rate      int
	}{
		{TransportWS, -200 * time.Millisecond, 500},
		{TransportPolling, -200 * time.Millisecond, 500},
		// 16 admissions over 800 ms: the kill finds shoppers admitted,
		// buying or following their orders, and others still waiting.
		{TransportWS, 300 * time.Millisecond, 20},
		{TransportPolling, 300 * time.Millisecond, 20},
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.transport, tc.killAt), func(t *testing.T) {
			transport := tc.transport
			f := newFakeStackWith(t, false, fakeFaults{}, 2)
			cfg := fakeConfig(f)
			urls := f.urls()
			cfg.BaseURL, cfg.BaseURLs = urls[0], urls[1:]
			cfg.Transport, cfg.PollInterval = transport, 100*time.Millisecond
			// 8 shoppers a gateway for 10 units: the sale sells out only
			// if the dead gateway's shoppers buy through the other.
			cfg.Shoppers, cfg.AdmissionRate = 16, tc.rate
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			killed := make(chan struct{})
			go func() {
				defer close(killed)
				var opens time.Time
				for opens.IsZero() {
					if !sleepCtx(ctx, 10*time.Millisecond) {
						return
					}
					f.mu.Lock()
					opens = f.opensAt
					f.mu.Unlock()
				}
				if sleepCtx(ctx, time.Until(opens.Add(tc.killAt))) {
					f.kill(0)
				}
			}()
			r, err := Run(ctx, cfg)
			cancel()
			<-killed
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if r.Orders.Reserved != 10 || r.Orders.Sold != 10 || r.Stopped != "done" {
				t.Errorf("orders = %+v, stopped %q; want 10 reserved and sold, done", r.Orders, r.Stopped)
			}
			sm := r.Summary
			if sm.GatewayMoves == 0 || sm.NetworkErrors.Total == 0 || sm.HTTP5xx.Total != 0 {
				t.Errorf("summary: %d moves, network errors %+v, 5xx %+v; want moves and network errors, no 5xx",
					sm.GatewayMoves, sm.NetworkErrors, sm.HTTP5xx)
			}
			if transport == TransportWS && (sm.Reconnects == 0 || r.Steps[StepRejoin].Count == 0) {
				t.Errorf("%d reconnects, rejoins %v: want the first gateway's shoppers back in the room", sm.Reconnects, r.Steps[StepRejoin].Outcomes)
			}
			if sm.PlacesLost != 0 {
				t.Errorf("%d places lost", sm.PlacesLost)
			}
			if len(r.Ledger) != 10 || sm.Acknowledged != 10 {
				t.Fatalf("ledger of %d orders, %d acknowledged; want 10", len(r.Ledger), sm.Acknowledged)
			}
			for _, e := range r.Ledger {
				if (e.Gateway != urls[1] && tc.killAt < 0) || !e.Acknowledged || e.Source != SourcePurchase202 || e.AtMs < 0 ||
					(e.Final != "PENDING" && e.Final != "PAID") || e.APIStatus != e.Final {
					t.Errorf("ledger entry %+v: want a 202 through %s, kept", e, urls[1])
				}
			}
			if len(r.Timeline.ReservationsMs) != 10 || len(r.Timeline.AdmissionsMs) < 10 ||
				!slices.IsSorted(r.Timeline.ReservationsMs) || r.Timeline.ReservationsMs[0] < 0 {
				t.Errorf("timeline = %+v, want 10 reservations and as many admissions, sorted, after the opening", r.Timeline)
			}
		})
	}
}

// TestReportSummaryJSON: the names the fault suite reads.
func TestReportSummaryJSON(t *testing.T) {
	r := &Report{Summary: &Summary{}, Ledger: []LedgerEntry{{OrderID: "x"}}}
	r.Summary.tallyResponses(map[string]int64{"purchase 500": 2, "order_get 503 with Retry-After": 3, "pay 503 without Retry-After": 1},
		map[string]int64{"purchase conn_refused": 4})
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Summary  map[string]json.RawMessage `json:"summary"`
		Ledger   []map[string]any           `json:"ledger"`
		Timeline map[string]any             `json:"timeline"`
	}
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"oversold", "acknowledged", "acknowledgedLost", "acknowledgedRejected", "strandedUnits", "http5xx", "networkErrors", "http503RetryAfter"} {
		if _, ok := back.Summary[k]; !ok {
			t.Errorf("summary lacks %q", k)
		}
	}
	var h Tally
	json.Unmarshal(back.Summary["http5xx"], &h)
	if h.Total != 3 || h.ByRoute["purchase 500"] != 2 || h.ByRoute["pay 503 without Retry-After"] != 1 {
		t.Errorf("http5xx = %+v, want purchase 500 × 2 and pay 503 without Retry-After × 1", h)
	}
	for _, k := range []string{"orderId", "userId", "itemId", "gateway", "source", "acknowledged", "atMs", "atUnixMs", "apiStatus", "final"} {
		if _, ok := back.Ledger[0][k]; !ok {
			t.Errorf("ledger entry lacks %q", k)
		}
	}
	for _, k := range []string{"admissionsMs", "reservationsMs"} {
		if _, ok := back.Timeline[k]; !ok {
			t.Errorf("timeline lacks %q", k)
		}
	}
}

// TestSettleLedger: the verdict of each order from its API read-back and
// its PostgreSQL row.
func TestSettleLedger(t *testing.T) {
	tests := []struct {
		name, api string
		db        map[string]string // nil: not read
		want      string
		count     func(Summary) int64
	}{
		{"paid", "PAID", map[string]string{"a": "PAID"}, "PAID", nil},
		{"tombstone wins over the API", "PENDING", map[string]string{"a": "REJECTED"}, "REJECTED", func(s Summary) int64 { return s.AcknowledgedRejected }},
		{"in flight", "PENDING", map[string]string{}, "PENDING", func(s Summary) int64 { return s.AcknowledgedInFlight }},
		{"nowhere", "NOT_FOUND", map[string]string{}, FinalMissing, func(s Summary) int64 { return s.AcknowledgedLost }},
		{"not found without a database", "NOT_FOUND", nil, FinalMissing, func(s Summary) int64 { return s.AcknowledgedLost }},
		{"row without an API answer", "UNREAD conn_refused", map[string]string{"a": "EXPIRED"}, "EXPIRED", nil},
		{"unread", "UNREAD timeout", nil, FinalUnknown, func(s Summary) int64 { return s.AcknowledgedUnverified }},
		{"cancelled by someone else", "CANCELLED", nil, "CANCELLED", func(s Summary) int64 { return s.AcknowledgedCancelled }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := []LedgerEntry{{OrderID: "A", Acknowledged: true, Source: SourcePurchase202, APIStatus: tt.api}}
			settle(l, tt.db)
			if l[0].Final != tt.want {
				t.Errorf("final = %q, want %q (%+v)", l[0].Final, tt.want, l[0])
			}
			var sm Summary
			sm.tallyLedger(l, tt.db != nil)
			bad := sm.AcknowledgedLost + sm.AcknowledgedRejected + sm.AcknowledgedCancelled + sm.AcknowledgedUnverified
			switch {
			case tt.count == nil && (bad != 0 || sm.AcknowledgedInFlight != 0):
				t.Errorf("summary %+v, want the order kept", sm)
			case tt.count != nil && tt.count(sm) != 1:
				t.Errorf("summary %+v, want it counted once", sm)
			}
		})
	}
	// An order never acknowledged may end REJECTED.
	l := []LedgerEntry{{OrderID: "b", Source: SourcePurchase503, APIStatus: "REJECTED"}}
	settle(l, nil)
	var sm Summary
	sm.tallyLedger(l, false)
	if sm.UnacknowledgedRejected != 1 || sm.AcknowledgedRejected != 0 || sm.OrdersBySource[SourcePurchase503] != 1 {
		t.Errorf("summary %+v, want one unacknowledged rejection", sm)
	}
}
