package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestMain lets the test binary act as a forked worker (Processes > 1).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == WorkerArg {
		if err := RunWorker(context.Background()); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestHistQuantile(t *testing.T) {
	var h Hist
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Millisecond)
	}
	tests := []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Millisecond}, {0.9, 900 * time.Millisecond}, {0.99, 990 * time.Millisecond}, {1, time.Second}}
	for _, tt := range tests {
		got := h.Quantile(tt.q)
		if rel := math.Abs(float64(got-tt.want)) / float64(tt.want); rel > 0.05 || got < tt.want {
			t.Errorf("Quantile(%v) = %v, want %v (+5%% at most)", tt.q, got, tt.want)
		}
	}
	if got := time.Duration(h.MaxNs); got != time.Second {
		t.Errorf("max = %v, want 1s", got)
	}
	// Merging two halves gives the same histogram.
	var a, b Hist
	for i := 1; i <= 1000; i++ {
		if i%2 == 0 {
			a.add(time.Duration(i) * time.Millisecond)
		} else {
			b.add(time.Duration(i) * time.Millisecond)
		}
	}
	a.merge(&b)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		if got, want := a.Quantile(q), h.Quantile(q); got != want {
			t.Errorf("merged Quantile(%v) = %v, want %v", q, got, want)
		}
	}
	var empty Hist
	if got := empty.Quantile(0.5); got != 0 {
		t.Errorf("empty Quantile = %v, want 0", got)
	}
	var one Hist
	one.add(3 * time.Millisecond)
	if got := one.Quantile(0.99); got != 3*time.Millisecond {
		t.Errorf("single-sample Quantile = %v, want 3ms (clamped to max)", got)
	}
}

func TestBucketBounds(t *testing.T) {
	for _, d := range []time.Duration{0, time.Microsecond, 11 * time.Microsecond, time.Millisecond, 1234 * time.Millisecond, time.Hour} {
		i := bucketOf(d)
		if i > 0 && i < histBuckets-1 && (d > bucketUpper(i) || d <= bucketUpper(i-1)) {
			t.Errorf("bucketOf(%v) = %d: bounds (%v, %v]", d, i, bucketUpper(i-1), bucketUpper(i))
		}
	}
}

func TestSourceAddr(t *testing.T) {
	tests := []struct {
		i    int
		want string
	}{{0, "127.0.0.2"}, {1, "127.0.0.3"}, {253, "127.0.0.255"}, {254, "127.0.1.0"}, {65000, "127.0.253.234"}}
	for _, tt := range tests {
		if got := sourceAddr(tt.i).String(); got != tt.want {
			t.Errorf("sourceAddr(%d) = %s, want %s", tt.i, got, tt.want)
		}
	}
}

func TestScenarios(t *testing.T) {
	for _, name := range ScenarioNames() {
		c, err := Scenario(name)
		if err != nil {
			t.Fatalf("Scenario(%q): %v", name, err)
		}
		c.BaseURL, c.JWTSecret = "http://127.0.0.1:1", "x"
		if _, err := c.withDefaults(); err != nil {
			t.Errorf("Scenario(%q) invalid: %v", name, err)
		}
	}
	if _, err := Scenario("nope"); err == nil {
		t.Error("Scenario(nope): want an error")
	}
	c, _ := Scenario("drop")
	if c.Shoppers != 100_000 || c.Quantity != 10_000 || c.Processes*19_000 < c.Shoppers {
		t.Errorf("drop = %d shoppers, %d units, %d processes", c.Shoppers, c.Quantity, c.Processes)
	}
}

func TestCheckRunInvariants(t *testing.T) {
	okFigs := []ItemFigures{{ID: 1, Quantity: 2, Remaining: 0, Sold: 2, Paid: 1}, {ID: 2, Quantity: 1, Remaining: 1}}
	okOrders := map[int64][]orderRecord{
		10: {{OrderID: "a", ItemID: 1, Status: "PAID", Via: 202}},
		11: {{OrderID: "b", ItemID: 1, Status: "PENDING", Via: 202}, {OrderID: "b", ItemID: 1, Via: 409}},
		12: {{OrderID: "c", ItemID: 2, Status: "EXPIRED", Via: 202}, {OrderID: "d", ItemID: 1, Status: "EXPIRED", Via: 202}},
	}
	tests := []struct {
		name   string
		orders map[int64][]orderRecord
		figs   []ItemFigures
		broken []string
	}{
		{"all hold", okOrders, okFigs, nil},
		{"two live orders of one user", map[int64][]orderRecord{10: {{OrderID: "a", ItemID: 1, Via: 202}, {OrderID: "b", ItemID: 2, Via: 202}}}, okFigs,
			[]string{"one order per user (run)"}},
		{"run oversold", map[int64][]orderRecord{10: {{OrderID: "a", ItemID: 2}}, 11: {{OrderID: "b", ItemID: 2}}}, okFigs,
			[]string{"orders ≤ stock (run)"}},
		{"admin oversold", okOrders, []ItemFigures{{ID: 1, Quantity: 2, Remaining: -1, Sold: 3, Paid: 1}, {ID: 2, Quantity: 1, Remaining: 1}},
			[]string{"orders ≤ stock (admin API)"}},
		{"not conserved", okOrders, []ItemFigures{{ID: 1, Quantity: 2, Remaining: 1, Sold: 2, Paid: 1}, {ID: 2, Quantity: 1, Remaining: 1}},
			[]string{"conservation"}},
		{"payment lost", okOrders, []ItemFigures{{ID: 1, Quantity: 2, Sold: 2}, {ID: 2, Quantity: 1, Remaining: 1}},
			[]string{"payments persisted"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Report{}
			r.checkRun(tt.orders, tt.figs, true, "")
			var got []string
			for _, c := range r.Invariants {
				if !c.OK && !c.Skipped {
					got = append(got, c.Name)
				}
			}
			if strings.Join(got, ",") != strings.Join(tt.broken, ",") {
				t.Errorf("broken = %q, want %q (%+v)", got, tt.broken, r.Invariants)
			}
			if err := r.Err(); (err != nil) != (len(tt.broken) > 0) {
				t.Errorf("Err() = %v, want error: %v", err, len(tt.broken) > 0)
			}
		})
	}
	r := &Report{}
	r.checkRun(okOrders, nil, false, "")
	if err := r.Err(); err != nil {
		t.Errorf("without figures, checks are skipped, got %v", err)
	}
}

func TestReportAggregation(t *testing.T) {
	epoch := time.Now()
	opens := epoch.Add(time.Second)
	a, b := newRecorder(epoch), newRecorder(epoch)
	a.observe(StepPurchase, "202", epoch.Add(1100*time.Millisecond), 5*time.Millisecond, true)
	a.observe(StepPurchase, "410 SOLD_OUT", epoch.Add(1150*time.Millisecond), 1*time.Millisecond, true)
	b.observe(StepPurchase, "410 SOLD_OUT", epoch.Add(1250*time.Millisecond), 2*time.Millisecond, true)
	b.observe(StepAdmittedWait, "SOLD_OUT", opens, 300*time.Millisecond, false)
	a.mark(markFirstSoldOut, opens.Add(400*time.Millisecond))
	b.mark(markFirstSoldOut, opens.Add(300*time.Millisecond))
	a.mark(markFirstAdmitted, opens)
	a.mark(markLastAdmitted, opens.Add(time.Second))
	a.live.admitted.Add(11)
	a.order(5, orderRecord{OrderID: "x", ItemID: 1, Status: "PENDING", Via: 202})
	a.order(5, orderRecord{OrderID: "x", ItemID: 1, Status: "PAID", Via: 202})
	p := a.result()
	// b's result goes through JSON as from a worker process.
	js, err := json.Marshal(b.result())
	if err != nil {
		t.Fatal(err)
	}
	var bp partial
	if err := json.Unmarshal(js, &bp); err != nil {
		t.Fatal(err)
	}
	merged := newRecorder(epoch)
	merged.mergeRemote(p)
	merged.mergeRemote(&bp)
	r := &Report{OpensAt: opens}
	r.fill(merged.result())
	if got := r.Steps[StepPurchase].Outcomes["410 SOLD_OUT"]; got != 2 {
		t.Errorf("purchase 410s = %d, want 2", got)
	}
	if got := r.Steps[StepPurchase].Count; got != 3 {
		t.Errorf("purchase count = %d, want 3", got)
	}
	if r.SellOutMs != 300 {
		t.Errorf("SellOutMs = %d, want 300", r.SellOutMs)
	}
	if math.Abs(r.AdmissionsPerSec-10) > 0.01 {
		t.Errorf("AdmissionsPerSec = %v, want 10", r.AdmissionsPerSec)
	}
	if r.Orders.Reserved != 1 || r.Orders.PaidRun != 1 || r.Orders.Users != 1 {
		t.Errorf("orders = %+v, want 1 reserved, 1 paid, 1 user", r.Orders)
	}
	if r.Counters.Admitted != 11 {
		t.Errorf("admitted = %d, want 11", r.Counters.Admitted)
	}
	// Slots 11 and 12 hold the purchases; 13 the admitted wait (no request).
	if len(r.Timeseries) != 14 || r.Timeseries[11].Requests != 2 || r.Timeseries[12].Requests != 1 ||
		r.Timeseries[12].Outcomes["purchase 410 SOLD_OUT"] != 1 || r.Timeseries[13].Requests != 0 || r.Timeseries[13].Outcomes["admitted_wait SOLD_OUT"] != 1 {
		t.Errorf("timeseries = %+v", r.Timeseries)
	}
}

func TestWriters(t *testing.T) {
	r := &Report{Scenario: "smoke <b>", SaleID: 7, SellOutMs: 120, Transport: "ws",
		Invariants: []InvariantResult{{Name: "conservation", OK: true}, {Name: "x", Detail: "<script>alert(1)</script>"}},
		Redis:      &RedisReport{HostileRequests: 10},
		CPU:        &CPUReport{Roles: map[string]CPURole{"gateway": {PIDs: []int{5}, CPUSeconds: CPUSeconds{Window: 1, Total: 2}}}},
		Summary:    &Summary{AcknowledgedRejected: 3, HTTP5xx: Tally{Total: 1, ByRoute: map[string]int64{"purchase 500": 1}}}}
	rec := newRecorder(time.Now())
	for i := range 100 {
		rec.observe(StepPurchase, "410 SOLD_OUT", time.Now(), time.Duration(i)*time.Millisecond, true)
	}
	rec.observe(StepJoin, "PREQUEUE", time.Now(), time.Millisecond, true)
	r.fill(rec.result())
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not decode: %v", err)
	}
	for _, k := range []string{"steps", "invariants", "timeseries", "sellOutMs", "redis", "orders", "cpu"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	var h bytes.Buffer
	if err := r.WriteHTML(&h); err != nil {
		t.Fatal(err)
	}
	s := h.String()
	for _, want := range []string{"<svg", "polyline", "latency histogram purchase", "BROKEN", "&lt;script&gt;", "Promises under faults", "purchase 500 × 1", "cpu gateway"} {
		if !strings.Contains(s, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", " src=", "href=", "<link"} {
		if strings.Contains(s, bad) {
			t.Errorf("HTML contains %q (must be self-contained and escaped)", bad)
		}
	}
}

func fakeConfig(f *fakeStack) Config {
	return Config{
		BaseURL: f.srv.URL, JWTSecret: testSecret, UserBase: 1000,
		Shoppers: 50, Quantity: 10, Items: 2, AdmissionRate: 500, StartsIn: 800 * time.Millisecond,
		JoinSpread: 300 * time.Millisecond, PayFraction: 0.5, Duration: 20 * time.Second, QuietTimeout: 3 * time.Second,
	}
}

func TestRunFakeWebSocket(t *testing.T) {
	f := newFakeStack(t, false)
	cfg := fakeConfig(f)
	cfg.SourceAddrs = 4
	cfg.Hostile = Hostile{PurchaseFlood: 40, EarlyClicks: 10, OneAddrUsers: 3, Concurrency: 8}
	// Every join must come before the opening (50 in PREQUEUE), after
	// the sale, the early clicks and half the flood: 800 ms was a speed a
	// loaded machine with the race detector does not reach. Duration and
	// QuietTimeout only bound the run, which ends when the shoppers are
	// done.
	cfg.StartsIn = 5 * time.Second
	cfg.Duration, cfg.QuietTimeout = time.Minute, 15*time.Second
	var prog bytes.Buffer
	cfg.Progress = &prog
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r.Orders.Reserved != 10 || r.Orders.Sold != 10 || r.Orders.Remaining != 0 {
		t.Errorf("orders = %+v, want 10 reserved and sold", r.Orders)
	}
	if r.Stopped != "done" {
		t.Errorf("stopped = %q, want done", r.Stopped)
	}
	if got := r.Steps[StepPurchase].Outcomes["202"]; got+r.Steps[oneAddrPrefix+StepPurchase].Outcomes["202"] != 10 {
		t.Errorf("202s = %d (+ one-address), want 10 in all: %+v", got, r.Steps[StepPurchase].Outcomes)
	}
	if got := r.Steps[StepJoin].Outcomes["PREQUEUE"]; got != 50 {
		t.Errorf("joins in PREQUEUE = %d, want 50 (%v)", got, r.Steps[StepJoin].Outcomes)
	}
	for _, n := range r.Notes {
		if strings.Contains(n, "refused at join") {
			t.Errorf("note %q without a refused join", n)
		}
	}
	aw := r.Steps[StepAdmittedWait].Outcomes
	if aw["ADMITTED"]+aw["SOLD_OUT"] != 50 {
		t.Errorf("admitted wait outcomes = %v, want 50 in all", aw)
	}
	if r.SellOutMs < 0 {
		t.Errorf("SellOutMs = %d, want ≥ 0", r.SellOutMs)
	}
	fl := r.Steps[StepFlood].Outcomes
	if fl["401 UNAUTHENTICATED"] != 20 || fl["403 NOT_ADMITTED"] != 20 {
		t.Errorf("flood outcomes = %v, want 20 × 401 and 20 × 403", fl)
	}
	if got := r.Steps[StepEarly].Outcomes["403 NOT_ADMITTED"]; got != 10 {
		t.Errorf("early clicks 403 = %d, want 10", got)
	}
	if r.Steps[StepPay].Count == 0 || r.Orders.PaidRun == 0 || r.Orders.Paid != r.Orders.PaidRun {
		t.Errorf("pay: %d requests, paid by run %d, persisted %d", r.Steps[StepPay].Count, r.Orders.PaidRun, r.Orders.Paid)
	}
	for _, c := range r.Invariants {
		if !c.OK && !c.Skipped {
			t.Errorf("invariant %s broken: %s", c.Name, c.Detail)
		}
	}
	ips := f.sourceIPs()
	for _, want := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.1.0.1"} {
		if ips[want] == 0 {
			t.Errorf("no request from %s: %v", want, ips)
		}
	}
	if ips["127.0.0.6"] != 0 {
		t.Errorf("requests from 127.0.0.6 with 4 source addresses: %v", ips)
	}
	if !strings.Contains(prog.String(), "joined") || !strings.Contains(prog.String(), "\r") {
		t.Errorf("progress output = %q", prog.String())
	}
}

// TestRunFakePreconnectAndPayAfter: before the opening each source address
// warms Preconnect connections to every gateway, and a winner pays only
// after its think time (50–150% of PayAfter) once the order is payable.
func TestRunFakePreconnectAndPayAfter(t *testing.T) {
	f := newFakeStack(t, false)
	cfg := fakeConfig(f)
	cfg.SourceAddrs, cfg.Preconnect = 3, 2
	cfg.PayFraction, cfg.PayAfter = 1, 400*time.Millisecond
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := r.Steps[StepPreconnect].Outcomes["200"]; got != 3*2 {
		t.Errorf("preconnect outcomes %v, want 6 × 200 (3 addresses × 1 gateway × 2)", r.Steps[StepPreconnect].Outcomes)
	}
	f.mu.Lock()
	views := f.publicViews
	var paid int
	for _, o := range f.orders {
		if o.Status != "PAID" {
			continue
		}
		paid++
		// payable 20 ms after creation (the fake), the first look at
		// the order 1 s after the 202, then at least 200 ms of thought
		if d := o.Paid.Sub(o.Created); d < time.Second+200*time.Millisecond {
			t.Errorf("order %s paid %v after its creation, want ≥ 1.2 s", o.ID, d)
		}
	}
	f.mu.Unlock()
	if views != 6 {
		t.Errorf("public sale views %d, want the 6 preconnects", views)
	}
	if paid != 10 || r.Orders.PaidRun != 10 {
		t.Errorf("paid %d (run says %d), want all 10", paid, r.Orders.PaidRun)
	}
}

// TestRunFakeLinger: a shopper who saw SOLD_OUT without buying stays
// connected 50–150% of Linger before leaving; without Linger it leaves at
// once. Linger is 2 s so that the two cases stay a second apart even on a
// crowded machine, where a loser who leaves at once still waits for a CPU
// before it goes.
func TestRunFakeLinger(t *testing.T) {
	const linger2 = 2 * time.Second
	for _, linger := range []time.Duration{0, linger2} {
		// Half the shoppers are never admitted, so that some wait until
		// the sell-out however slowly the admitted ones buy.
		f := newFakeStackWith(t, false, fakeFaults{admitOnly: 25}, 1)
		cfg := fakeConfig(f)
		cfg.Linger = linger
		if _, err := Run(context.Background(), cfg); err != nil {
			t.Fatalf("Run: %v", err)
		}
		f.mu.Lock()
		stays := slices.Clone(f.soldOutStays)
		f.mu.Unlock()
		if len(stays) == 0 {
			t.Fatalf("linger %v: no shopper saw SOLD_OUT without buying", linger)
		}
		lo, hi := slices.Min(stays), slices.Max(stays)
		switch {
		case linger == 0 && hi >= linger2/2:
			t.Errorf("no linger: a loser stayed %v after SOLD_OUT, want it gone at once (well before the %v a lingering one stays at least)", hi, linger2/2)
		case linger > 0 && (lo < linger/2 || hi > linger*3/2+time.Second):
			t.Errorf("linger %v: losers stayed %v…%v after SOLD_OUT, want 50–150%% of it", linger, lo, hi)
		}
	}
}

func TestRunFakePolling(t *testing.T) {
	f := newFakeStack(t, false)
	cfg := fakeConfig(f)
	cfg.Transport = TransportPolling
	cfg.Shoppers, cfg.Quantity, cfg.Items = 20, 5, 1
	cfg.PollInterval = 100 * time.Millisecond
	cfg.PayFraction = 1
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r.Orders.Reserved != 5 || r.Orders.Paid != 5 {
		t.Errorf("orders = %+v, want 5 reserved and paid", r.Orders)
	}
	if r.Steps[StepPoll].Count == 0 {
		t.Error("no polls recorded")
	}
	aw := r.Steps[StepAdmittedWait].Outcomes
	if aw["ADMITTED"]+aw["SOLD_OUT"] != 20 {
		t.Errorf("admitted wait outcomes = %v, want 20 in all", aw)
	}
}

func TestRunFakeWorkers(t *testing.T) {
	f := newFakeStack(t, false)
	cfg := fakeConfig(f)
	cfg.Processes = 2
	cfg.Shoppers = 30
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v (notes %v)", err, r.Notes)
	}
	if len(r.Notes) > 0 {
		t.Errorf("notes: %v", r.Notes)
	}
	if r.Orders.Reserved != 10 {
		t.Errorf("reserved = %d, want 10", r.Orders.Reserved)
	}
	if got := r.Steps[StepJoin].Count; got != 30 {
		t.Errorf("joins = %d, want 30 from the two workers", got)
	}
	if r.Counters.Joined != 30 {
		t.Errorf("counters = %+v, want 30 joined", r.Counters)
	}
}

func TestRunBrokenServerFails(t *testing.T) {
	f := newFakeStack(t, true) // oversells
	cfg := fakeConfig(f)
	cfg.Shoppers, cfg.Quantity, cfg.Items = 20, 5, 1
	r, err := Run(context.Background(), cfg)
	if err == nil {
		t.Fatal("Run against an overselling server: want an error")
	}
	if r == nil {
		t.Fatal("no report with the invariant error")
	}
	broken := map[string]bool{}
	for _, c := range r.Invariants {
		if !c.OK && !c.Skipped {
			broken[c.Name] = true
		}
	}
	if !broken["orders ≤ stock (admin API)"] || !broken["orders ≤ stock (run)"] {
		t.Errorf("broken = %v, want the oversell caught by the admin API and the run", broken)
	}
}

func TestRunFakeUntilPaid(t *testing.T) {
	f := newFakeStack(t, false)
	cfg := fakeConfig(f)
	cfg.Shoppers, cfg.Quantity, cfg.Items = 20, 4, 1
	cfg.PayFraction, cfg.KeepWaiting, cfg.UntilPaid = 1, true, true
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r.Stopped != "paid" || r.Orders.Paid != 4 {
		t.Errorf("stopped %q with %d paid, want paid with 4", r.Stopped, r.Orders.Paid)
	}
	// Losers still waiting when the last order is paid would hold the
	// shopper phase to its deadline; the whole run ends before it.
	if shopDeadline := r.StartedAt.Add(cfg.Duration - cfg.QuietTimeout - 2*time.Second); !r.FinishedAt.Before(shopDeadline) {
		t.Errorf("run finished at %v, after the shopper deadline %v: the losers kept it going", r.FinishedAt, shopDeadline)
	}
}

// TestRunFakeSoldOutQuiet: shoppers who keep waiting leave once the sale
// has been sold out with nothing on its way back for SoldOutQuiet (here
// nobody pays, so paid = quantity never ends it): the phase ends "quiet",
// before its deadline, and nothing is stranded.
func TestRunFakeSoldOutQuiet(t *testing.T) {
	f := newFakeStack(t, false)
	cfg := fakeConfig(f)
	cfg.Shoppers, cfg.Quantity, cfg.Items = 20, 4, 1
	cfg.PayFraction, cfg.KeepWaiting, cfg.SoldOutQuiet = 0, true, 2*time.Second
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r.Stopped != "quiet" || r.Orders.Sold != 4 || r.Summary.StrandedUnits != 0 {
		t.Errorf("stopped %q, sold %d, stranded %d; want quiet, 4, 0", r.Stopped, r.Orders.Sold, r.Summary.StrandedUnits)
	}
	if shopDeadline := r.StartedAt.Add(cfg.Duration - cfg.QuietTimeout - 2*time.Second); !r.FinishedAt.Before(shopDeadline) {
		t.Errorf("run finished at %v, after the shopper deadline %v", r.FinishedAt, shopDeadline)
	}
}

// TestForUserSpreadsAddressesOverGateways: every source address reaches
// every gateway, whatever the counts (with idx%addrs for both, an even
// address count over two gateways would send each address to one gateway
// only, so the gateways' per-address connection cap would bite at half the
// intended spread).
func TestForUserSpreadsAddressesOverGateways(t *testing.T) {
	for _, tc := range []struct{ addrs, bases int }{{64, 2}, {256, 2}, {32, 4}, {3, 2}, {1, 3}} {
		bases := make([]string, tc.bases)
		for i := range bases {
			bases[i] = "http://127.0.0.1:" + itoa(int64(18081+i))
		}
		c := newClients(bases, tc.addrs)
		seen := map[[2]any]int{}
		for idx := range tc.addrs * tc.bases * 4 {
			hc, base := c.forUser(idx)
			seen[[2]any{hc, base}]++
		}
		if len(seen) != tc.addrs*tc.bases {
			t.Errorf("%d addresses × %d gateways: %d pairs used, want %d", tc.addrs, tc.bases, len(seen), tc.addrs*tc.bases)
		}
		for p, n := range seen {
			if n != 4 {
				t.Errorf("%d addresses × %d gateways: pair %v used %d times, want 4", tc.addrs, tc.bases, p[1], n)
			}
		}
		c.close()
	}
}

// TestFirstItemIndependentOfGateway: the shoppers of every gateway try
// every item first in about equal numbers, whatever the counts share (the
// user id modulo 10 items would send the shoppers of the odd gateways of 6
// to the odd items only). The draw is fixed by the seed.
func TestFirstItemIndependentOfGateway(t *testing.T) {
	s := &shard{cfg: Config{Seed: 7}}
	const gateways, items, shoppers = 6, 10, 60000
	var count [gateways][items]int
	for g := range shoppers {
		userID := int64(1 + g) // as runShoppers numbers them
		count[g%gateways][s.firstItem(userID, items)]++
	}
	want := shoppers / gateways / items
	for gw := range count {
		for it, n := range count[gw] {
			if n < want*8/10 || n > want*12/10 {
				t.Errorf("gateway %d: item %d first for %d shoppers, want about %d", gw, it, n, want)
			}
		}
	}
	if a, b := s.firstItem(42, items), s.firstItem(42, items); a != b {
		t.Errorf("firstItem(42) = %d then %d: not fixed by the seed", a, b)
	}
}

// TestJoinRefusalNote: shoppers refused at the door with 429 (WebSocket
// upgrade or polling join) get a note naming how many shoppers the run put
// on each address of each gateway; none refused, no note.
func TestJoinRefusalNote(t *testing.T) {
	cfg := Config{Shoppers: 50_000, SourceAddrs: 60, BaseURL: "http://a", BaseURLs: []string{"http://b", "http://c"}}
	join := StepReport{Count: 50_000, Outcomes: map[string]int64{"PREQUEUE": 35_000, "ws_429": 14_000, "429 RATE_LIMITED": 1_000}}
	n := joinRefusalNote(cfg, join)
	for _, want := range []string{"15000 of 50000 shoppers were refused", "about 278 shoppers on each source address of each gateway",
		"50000 shoppers, 60 addresses, 3 gateways", "FLASHSALE_WS_MAX_CONNS_PER_ADDR", "--source-addrs"} {
		if !strings.Contains(n, want) {
			t.Errorf("note %q lacks %q", n, want)
		}
	}
	if n := joinRefusalNote(cfg, StepReport{Count: 50_000, Outcomes: map[string]int64{"PREQUEUE": 50_000}}); n != "" {
		t.Errorf("note %q with no refusal", n)
	}
	cfg.SourceAddrs, cfg.BaseURLs = 0, nil // every shopper on one address and gateway
	if n := joinRefusalNote(cfg, join); !strings.Contains(n, "about 50000 shoppers") {
		t.Errorf("unbound sockets: note %q", n)
	}
}

// TestCrowdedAddrWarning: a WebSocket run that puts more shoppers on an
// address of a gateway than the default cap is warned before it starts;
// one within the cap, or polling (no held connection), is not.
func TestCrowdedAddrWarning(t *testing.T) {
	cfg := Config{Transport: TransportWS, Shoppers: 25_000, SourceAddrs: 30, BaseURL: "http://a", BaseURLs: []string{"http://b"}}
	w := crowdedAddrWarning(cfg)
	for _, want := range []string{"about 417 shoppers on each source address of each gateway", "25000 shoppers, 30 addresses, 2 gateways",
		"FLASHSALE_WS_MAX_CONNS_PER_ADDR"} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
	cfg.SourceAddrs = 120 // 105 an address and gateway
	if w := crowdedAddrWarning(cfg); w != "" {
		t.Errorf("warning %q within the cap", w)
	}
	cfg.SourceAddrs, cfg.Transport = 30, TransportPolling
	if w := crowdedAddrWarning(cfg); w != "" {
		t.Errorf("warning %q for polling", w)
	}
}

func TestRedisReportExcess(t *testing.T) {
	r := RedisReport{BaselineMs: 1000, BaselineCommands: 10, HostileMs: 500, HostileCommands: 6, HostileRequests: 100}
	r.computeExcess()
	if math.Abs(r.ExcessPerRequest-0.01) > 1e-9 {
		t.Errorf("ExcessPerRequest = %v, want 0.01", r.ExcessPerRequest)
	}
}

// TestRunFakeFirstWave: admissions that come before the shopper's turn
// with a not-before (the first wave) are bought from it: the tool waits,
// so no purchase is refused NOT_ADMITTED and the stock sells out.
func TestRunFakeFirstWave(t *testing.T) {
	f := newFakeStackWith(t, false, fakeFaults{firstWave: 2 * time.Second}, 1)
	r, err := Run(context.Background(), fakeConfig(f))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r.Orders.Reserved != 10 || r.Orders.Sold != 10 {
		t.Errorf("orders = %+v, want 10 reserved and sold", r.Orders)
	}
	if got := r.Steps[StepPurchase].Outcomes["403 NOT_ADMITTED"]; got != 0 {
		t.Errorf("%d purchases refused NOT_ADMITTED: the tool bought before the not-before", got)
	}
}

// Reaction times: a FastShare of the shoppers are fast clients (no
// delay), the others draw a log-normal time around the median; each
// shopper's draw is fixed by the seed.
func TestReactionTimes(t *testing.T) {
	s := &shard{cfg: Config{Seed: 7, Reaction: 800 * time.Millisecond, FastShare: 0.2}}
	var people []time.Duration
	fast := 0
	for u := int64(1); u <= 10000; u++ {
		d := s.reaction(u)
		if d != s.reaction(u) {
			t.Fatalf("user %d draws two reaction times", u)
		}
		if d == 0 {
			if !s.fastClient(u) {
				t.Fatalf("user %d clicks at once but is no fast client", u)
			}
			fast++
			continue
		}
		people = append(people, d)
	}
	if fast < 1800 || fast > 2200 {
		t.Fatalf("%d fast clients of 10,000, want about 2,000", fast)
	}
	slices.Sort(people)
	if med := people[len(people)/2]; med < 750*time.Millisecond || med > 850*time.Millisecond {
		t.Fatalf("median reaction %v, want about 800ms", med)
	}
	if p10 := people[len(people)/10]; p10 > 500*time.Millisecond || p10 < 300*time.Millisecond {
		t.Fatalf("10th percentile %v, want about 420ms (σ 0.5)", p10)
	}
	if none := (&shard{cfg: Config{Seed: 7}}).reaction(1); none != 0 {
		t.Fatalf("no Reaction set: %v, want 0", none)
	}
}

// The last unit given is read from the acknowledged orders' ids (UUIDv7,
// the server's clock when it held or reserved the unit): orders learnt of
// but never acknowledged and ids of another version do not count.
func TestAllocationMsFromOrderIDs(t *testing.T) {
	opens := time.Date(2026, 12, 4, 18, 0, 0, 0, time.UTC)
	idAt := func(at time.Time) string {
		id, err := uuid.NewV7()
		if err != nil {
			t.Fatal(err)
		}
		// The first 48 bits of a UUIDv7 are its Unix milliseconds.
		ms := at.UnixMilli()
		for i := 5; i >= 0; i-- {
			id[i] = byte(ms)
			ms >>= 8
		}
		return id.String()
	}
	if got := allocationMs(nil, opens); got != nil {
		t.Fatalf("no orders: %d, want none", *got)
	}
	ledger := []LedgerEntry{
		{OrderID: idAt(opens.Add(-2100 * time.Millisecond)), Acknowledged: true},
		{OrderID: idAt(opens.Add(-1500 * time.Millisecond)), Acknowledged: true},
		{OrderID: idAt(opens.Add(9 * time.Second))},     // not acknowledged
		{OrderID: uuid.NewString(), Acknowledged: true}, // v4: no time
	}
	if got := allocationMs(ledger, opens); got == nil || *got != -1500 {
		t.Fatalf("allocationMs = %v, want -1500", got)
	}
	ledger = append(ledger, LedgerEntry{OrderID: idAt(opens.Add(820 * time.Millisecond)), Acknowledged: true})
	if got := allocationMs(ledger, opens); got == nil || *got != 820 {
		t.Fatalf("allocationMs = %v, want 820", got)
	}
}
