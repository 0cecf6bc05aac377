// Package e2e runs the load harness against a whole in-process stack
// (internal/wiring on real Redis, PostgreSQL and kfake) at small N, with both
// waiting-room transports:
//
//	go test -race -count=1 ./loadtest/...
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/loadtest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const secret = "loadtest-e2e-secret-0123456789abcdef"

// stack is one in-process flashsale and the URLs of its own Redis logical
// database and PostgreSQL database (testenv hands out a fresh one per
// call, so they are read once and kept).
type stack struct {
	app         *wiring.App
	redisURL    string
	databaseURL string
}

func startApp(t *testing.T, mutate ...func(*wiring.Config)) stack {
	t.Helper()
	st := stack{redisURL: testenv.RedisURL(t), databaseURL: testenv.DatabaseURL(t)}
	cfg := wiring.Defaults()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.RedisURL = st.redisURL
	cfg.DatabaseURL = st.databaseURL
	cfg.KafkaBrokers = testenv.NewKafka(t).Brokers
	cfg.JWTSecret = secret
	cfg.ExpiryInterval = 200 * time.Millisecond
	for _, m := range mutate {
		m(&cfg)
	}
	a, err := wiring.Start(context.Background(), cfg, wiring.AllRoles, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("wiring.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	st.app = a
	return st
}

// setupBudget is how long a run has, from its start to the draw, to
// create its sale, take the Redis baseline and send the hostile phase.
const setupBudget = 6 * time.Second

// mustHold are the invariant checks a run against a whole stack must pass
// (none of them skipped).
var mustHold = []string{
	"one order per user (run)",
	"orders ≤ stock (run)",
	"orders ≤ stock (admin API)",
	"conservation",
	"payments persisted",
	"one order per user (PostgreSQL)",
	"orders ≤ stock (PostgreSQL)",
	"no reservation before the opening (PostgreSQL)",
	"every order told to its shopper (PostgreSQL)",
	"acknowledged orders kept",
	"no stranded stock",
	"no 5xx but 503 with Retry-After",
}

// TestSmokeAgainstStack runs the smoke scenario over each transport, and
// over the WebSocket for a sale allocated in queue order: every unit sold
// and paid, every invariant holds. In the last run a third of the shoppers
// are second accounts of another shopper (the same identity key): each
// person gets one place, the other account is refused DUPLICATE_IDENTITY,
// and no person ends with two orders.
func TestSmokeAgainstStack(t *testing.T) {
	for _, tc := range []struct {
		name, transport, allocation string
		duplicates, shadow          float64
	}{
		{loadtest.TransportWS, loadtest.TransportWS, "race", 0, 0},
		{loadtest.TransportPolling, loadtest.TransportPolling, "race", 0, 0},
		{"ws-queue-order", loadtest.TransportWS, "queue", 0, 0},
		{"ws-duplicate-identities", loadtest.TransportWS, "queue", 0.33, 0},
		{"ws-shadowed", loadtest.TransportWS, "queue", 0.2, 0.3},
	} {
		transport := tc.transport
		t.Run(tc.name, func(t *testing.T) {
			st := startApp(t)
			cfg, err := loadtest.Scenario("smoke")
			if err != nil {
				t.Fatal(err)
			}
			cfg.BaseURL, cfg.AdminURL, cfg.JWTSecret = st.app.PublicURL, st.app.AdminURL, secret
			cfg.Redis.URL, cfg.DatabaseURL = st.redisURL, st.databaseURL
			cfg.Transport = transport
			cfg.Allocation = tc.allocation
			cfg.DuplicateIdentities = tc.duplicates
			cfg.ShadowShare = tc.shadow
			cfg.PollInterval = 200 * time.Millisecond
			cfg.SourceAddrs = 8
			// The Redis check compares the hostile phase's commands with
			// an idle baseline's rate; background work comes in bursts
			// (a room tick, the expiry worker's drain) of up to ~20
			// commands, which over the preset's 35 requests alone read
			// as 0.5 a request. 210 requests (half the flood and the
			// early clicks) keep such a burst under 0.1 a request, and
			// stay within the per-address burst of the 8 addresses.
			cfg.Hostile.PurchaseFlood = 400
			// The hostile phase's Redis counts must fall before the draw,
			// whose work (the record, the first wave, queue order's holds)
			// would count as the hostile requests': the smoke preset's
			// opening (2 s) comes before the stack's draw lead, so the
			// draw ran at the sale's creation, in the middle of the
			// measurement on a slow machine. The draw here comes
			// setupBudget after the run starts.
			cfg.StartsIn = wiring.DefaultDrawLead + setupBudget
			// Bounds, not speeds: the run ends when the shoppers are done
			// and the orders persisted, however slow the machine.
			cfg.Duration, cfg.QuietTimeout = 2*time.Minute, 30*time.Second
			r, err := loadtest.Run(context.Background(), cfg)
			if r == nil {
				t.Fatalf("Run: %v", err)
			}
			var b bytes.Buffer
			r.WriteJSON(&b)
			if err != nil || testing.Verbose() {
				t.Logf("report: %s", b.String())
			}
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			got := map[string]loadtest.InvariantResult{}
			for _, c := range r.Invariants {
				got[c.Name] = c
			}
			names := mustHold
			if tc.shadow > 0 {
				// A share of the shoppers (and, the identity rule on,
				// every second account) wait in the shadow queue: never
				// admitted, never buying, while the rest buy every unit.
				names = append(names[:len(names):len(names)], "one order per identity key (run)",
					"shadowed shoppers never admitted (run)", "shadowed shoppers never buy (admin API)")
				if sr := r.Shadow; sr == nil || sr.Drawn == 0 || sr.InQueue < sr.Drawn || sr.Server["risk"] != sr.Drawn || sr.Server["identity"] == 0 {
					t.Errorf("shadow report %+v: want every drawn shopper in the shadow queue by risk, and second accounts by identity", sr)
				}
			} else if tc.duplicates > 0 {
				names = append(names[:len(names):len(names)], "one order per identity key (run)")
				refused := int64(0)
				for out, n := range r.Steps["join"].Outcomes {
					if strings.Contains(out, "DUPLICATE_IDENTITY") {
						refused += n
					}
				}
				if refused == 0 {
					t.Errorf("no join refused DUPLICATE_IDENTITY (join outcomes %v)", r.Steps["join"].Outcomes)
				}
			}
			for _, name := range names {
				c, ok := got[name]
				switch {
				case !ok:
					t.Errorf("invariant %q not checked", name)
				case c.Skipped:
					t.Errorf("invariant %q skipped: %s", name, c.Detail)
				case !c.OK:
					t.Errorf("invariant %q broken: %s", name, c.Detail)
				}
			}
			o := r.Orders
			if o.Quantity != 10 {
				t.Errorf("quantity = %d, want the smoke preset's 10", o.Quantity)
			}
			if o.Reserved != o.Quantity {
				t.Errorf("reserved (202s) = %d, want quantity %d (%d shoppers)", o.Reserved, o.Quantity, r.Shoppers)
			}
			if o.Sold != o.Quantity || o.Remaining != 0 {
				t.Errorf("sold %d, remaining %d of %d", o.Sold, o.Remaining, o.Quantity)
			}
			// PayFraction 1: every winner pays.
			if o.Paid != o.Quantity || o.PaidRun != o.Quantity {
				t.Errorf("paid %d (admin API), %d (run), want %d", o.Paid, o.PaidRun, o.Quantity)
			}
			if o.Users != int(o.Reserved) {
				t.Errorf("%d users hold orders, %d reservations", o.Users, o.Reserved)
			}
			if p := r.Persist; p == nil || p.Error != "" || p.AllPersistedMs < 0 || p.Rows != o.Reserved {
				t.Errorf("persist report = %+v, want every reservation seen in PostgreSQL", p)
			} else if p.InsertedError != "" || p.LastInsertedMs < 0 || p.InsertedAfterLastCreatedMs < 0 {
				t.Errorf("persist report = %+v, want the rows' own last inserted_at, after the last created_at", p)
			}
			if r.Stopped != "done" {
				t.Errorf("stopped = %q, want done", r.Stopped)
			}
			// In queue order the drawn order decides: every unit goes to
			// the first 10 places (every smoke shopper buys at once).
			// (Second accounts refused at join have no place to rank.)
			if f := r.Fairness; f == nil || f.Error != "" || f.Units != o.Reserved || f.Shoppers < r.Shoppers && tc.duplicates == 0 {
				t.Errorf("fairness report %+v, want every 202 ranked by the draw", f)
			} else if tc.allocation == "queue" && f.OutOfRank != 0 {
				t.Errorf("queue order: %d of %d units bought outside the first %d places", f.OutOfRank, f.Units, o.Quantity)
			}
			// Every unit is given (held in queue order, reserved in race
			// order) before its buyer's last 202 is seen.
			if r.Allocation != tc.allocation || r.AllocationMs == nil || *r.AllocationMs > r.LastReservationMs {
				t.Errorf("allocation %q, last unit given at %v ms, last 202 at %d ms: want %s, given before the last 202", r.Allocation, r.AllocationMs, r.LastReservationMs, tc.allocation)
			}
			if sm := r.Summary; sm == nil || sm.Acknowledged != o.Reserved || len(r.Ledger) != int(o.Reserved) || len(r.Timeline.ReservationsMs) != int(o.Reserved) {
				t.Errorf("summary %+v, %d ledger entries, timeline %+v: want every 202 in each", sm, len(r.Ledger), r.Timeline)
			}
			for _, e := range r.Ledger {
				if e.DBStatus != "PAID" || e.APIStatus != "PAID" || e.Final != "PAID" {
					t.Errorf("ledger entry %+v: want PAID through the API and in PostgreSQL", e)
				}
			}
			if r.Redis == nil || r.Redis.HostileRequests == 0 || r.Redis.Error != "" {
				t.Errorf("redis report = %+v", r.Redis)
			} else if r.Redis.ExcessPerRequest > 0.5 {
				// A request that reached Redis costs at least one command;
				// background work (cache refresh, room ticks) is noise.
				t.Errorf("hostile requests reached Redis: %.3f commands each beyond the baseline (%+v)", r.Redis.ExcessPerRequest, *r.Redis)
			}
			t.Logf("%s: reserved %d, sold %d, paid %d, sell-out %d ms after opening, hostile %d requests → %d Redis commands (baseline %d in %d ms)",
				transport, o.Reserved, o.Sold, o.Paid, r.SellOutMs, r.Redis.HostileRequests, r.Redis.HostileCommands, r.Redis.BaselineCommands, r.Redis.BaselineMs)
		})
	}
}

// TestGatewayLostAgainstStack: of two gateways on the same Redis,
// PostgreSQL and broker, the second shuts down right after the opening
// (its listeners close, its WebSockets get "going away"): its shoppers
// reconnect to the first with the same token, keep their place and buy,
// and the run's invariants hold, the new ones included (every 202 kept,
// nothing stranded, no 5xx).
func TestGatewayLostAgainstStack(t *testing.T) {
	// The loss must come while shoppers still wait on the second gateway:
	// with a draw lead, the first wave would admit every place the stock
	// allows before the opening, and nobody would be left to move.
	noLead := func(c *wiring.Config) { c.DrawLead = 0 }
	st := startApp(t, noLead)
	cfg := wiring.Defaults()
	noLead(&cfg)
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.RedisURL, cfg.DatabaseURL = st.redisURL, st.databaseURL
	cfg.KafkaBrokers = st.app.KafkaBrokers
	cfg.JWTSecret = secret
	second, err := wiring.Start(context.Background(), cfg, wiring.Roles{Gateway: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("wiring.Start (second gateway): %v", err)
	}
	closed := false
	closeSecond := func() {
		if closed {
			return
		}
		closed = true
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		second.Close(ctx)
	}
	t.Cleanup(closeSecond)

	// 30 shoppers a gateway for 40 units: the sale sells out only if the
	// second gateway's shoppers buy through the first.
	lc := loadtest.Config{
		BaseURL: st.app.PublicURL, BaseURLs: []string{second.PublicURL}, AdminURL: st.app.AdminURL, JWTSecret: secret,
		DatabaseURL: st.databaseURL, UserBase: 2_000_000,
		// Race order: admissions at the rate leave shoppers waiting (in
		// queue order the first wave would hold all 40 units at once).
		Allocation: "race",
		Shoppers:   60, Quantity: 40, Items: 2, AdmissionRate: 40, StartsIn: 3 * time.Second,
		PayFraction: 1, SourceAddrs: 4, Duration: 60 * time.Second, QuietTimeout: 10 * time.Second,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	killed := make(chan struct{})
	started := time.Now()
	go func() {
		defer close(killed)
		// A quarter of the way into the sale's admissions.
		if d := lc.StartsIn + 250*time.Millisecond; d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		closeSecond()
	}()
	r, err := loadtest.Run(ctx, lc)
	cancel()
	<-killed
	if r == nil {
		t.Fatalf("Run: %v", err)
	}
	var b bytes.Buffer
	r.WriteJSON(&b)
	if err != nil {
		t.Fatalf("Run: %v\nsummary: %s", err, summaryJSON(r))
	}
	sm := r.Summary
	if sm.GatewayMoves == 0 || sm.Reconnects == 0 {
		t.Errorf("%d gateway moves, %d reconnects: want the second gateway's shoppers moved (closed %v after the start)",
			sm.GatewayMoves, sm.Reconnects, time.Since(started))
	}
	if r.Orders.Sold != 40 || sm.Acknowledged != r.Orders.Reserved || sm.Oversold != 0 {
		t.Errorf("sold %d of 40, %d acknowledged of %d 202s, oversold %d", r.Orders.Sold, sm.Acknowledged, r.Orders.Reserved, sm.Oversold)
	}
	for _, e := range r.Ledger {
		if e.Acknowledged && (e.DBStatus != "PAID" || e.Final != "PAID") {
			t.Errorf("ledger entry %+v: want paid, in PostgreSQL", e)
		}
	}
	t.Logf("summary: %s", summaryJSON(r))
}

func summaryJSON(r *loadtest.Report) string {
	b, _ := json.Marshal(r.Summary)
	return string(b)
}
