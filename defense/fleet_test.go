package defense

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// fleetOf returns n Guards sharing one clock with sharing on (the spend
// is carried by exchange, not Redis) and a per-user limit of lim.
func fleetOf(t *testing.T, n int, clk *fakeClock, lim Limit) []*Guard {
	t.Helper()
	gs := make([]*Guard, n)
	for i := range gs {
		g := NewGuard(GuardConfig{PowKey: []byte("k"), Now: clk.Now}, nil, nil, nil)
		// Without Redis NewGuard leaves sharing off; these tests carry the
		// messages themselves.
		g.ips.share, g.prefixes.share, g.users.share = true, true, true
		st := DefaultSettings()
		st.RateLimit.PerIP = Limit{}
		st.RateLimit.PerUser = lim
		st.RateLimit.Classes = nil
		g.Apply(st)
		gs[i] = g
	}
	return gs
}

// exchange delivers every Guard's spend since the last exchange to every
// Guard (each skips its own), through the wire format.
func exchange(t *testing.T, gs []*Guard, now time.Time) {
	t.Helper()
	for _, from := range gs {
		for _, raw := range from.collectSpend() {
			m, err := parseSpend(raw)
			if err != nil {
				t.Fatalf("own spend message does not parse: %v", err)
			}
			for _, to := range gs {
				to.applySpend(m, now)
			}
		}
	}
}

// TestFleetSpendArithmetic drives three gateways with an injected clock:
// a user spraying all three at 10 times the limit gets at most
// R·W + N·B + (N−1)·R·L through in W seconds (L: the sharing interval), and
// no less than the limit; a user whose requests all land on one gateway
// gets the whole limit, R·W + B.
func TestFleetSpendArithmetic(t *testing.T) {
	const (
		n     = 3
		rps   = 10.0
		burst = 5
		every = 100 * time.Millisecond // sharing interval L
		step  = 10 * time.Millisecond  // one request each step: 10 × the limit
		span  = 20 * time.Second       // W
	)
	lim := Limit{RPS: rps, Burst: burst}
	tests := []struct {
		name   string
		target func(i int) int // which gateway request i goes to
		share  bool
		lo, hi float64
	}{
		{
			name:   "spray shared",
			target: func(i int) int { return i % n },
			share:  true,
			lo:     rps * span.Seconds() * 0.9,
			hi:     rps*span.Seconds() + n*burst + (n-1)*rps*every.Seconds(),
		},
		{
			name:   "sticky shared",
			target: func(int) int { return 0 },
			share:  true,
			lo:     rps*span.Seconds() + burst - 1,
			hi:     rps*span.Seconds() + burst + 1,
		},
		{
			// Without sharing the spray gets about n times the limit: what
			// the test above guards against.
			name:   "spray alone",
			target: func(i int) int { return i % n },
			share:  false,
			lo:     n * rps * span.Seconds() * 0.9,
			hi:     n * (rps*span.Seconds() + burst),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			gs := fleetOf(t, n, clk, lim)
			start := clk.Now()
			allowed, nextShare := 0, start.Add(every)
			for i := 0; clk.Now().Sub(start) < span; i++ {
				if _, err := gs[tt.target(i)].CheckUser(7, ClassRead); err == nil {
					allowed++
				}
				clk.Add(step)
				if !clk.Now().Before(nextShare) {
					if tt.share {
						exchange(t, gs, clk.Now())
					} else {
						for _, g := range gs {
							g.collectSpend()
						}
					}
					nextShare = nextShare.Add(every)
				}
			}
			t.Logf("allowed %d in %s (want %.0f..%.0f)", allowed, span, tt.lo, tt.hi)
			if got := float64(allowed); got < tt.lo || got > tt.hi {
				t.Errorf("allowed %d in %s, want %.0f..%.0f", allowed, span, tt.lo, tt.hi)
			}
		})
	}
}

// TestFleetDebtAndRetry: another gateway's spend is taken off this one's
// bucket below zero, and the retry delay says when the debt is paid.
func TestFleetDebtAndRetry(t *testing.T) {
	clk := newFakeClock()
	gs := fleetOf(t, 2, clk, Limit{RPS: 10, Burst: 10})
	a, b := gs[0], gs[1]
	if _, err := b.CheckUser(7, ClassRead); err != nil { // b holds a bucket, 9 left
		t.Fatal(err)
	}
	for range 10 {
		if _, err := a.CheckUser(7, ClassRead); err != nil {
			t.Fatal(err)
		}
	}
	exchange(t, gs, clk.Now())
	got, ok := b.users.tokens(userKey{0, 7}, clk.Now())
	if !ok || math.Abs(got-(-1)) > 1e-9 {
		t.Fatalf("b's tokens after a's 10 = %v (held %v), want -1", got, ok)
	}
	got, _ = a.users.tokens(userKey{0, 7}, clk.Now())
	if math.Abs(got-(-1)) > 1e-9 {
		t.Fatalf("a's tokens after b's 1 = %v, want -1", got)
	}
	wait, err := b.CheckUser(7, ClassRead)
	if err == nil || wait != 200*time.Millisecond {
		t.Fatalf("b after the debt: wait %v, err %v; want RATE_LIMITED and 200ms", wait, err)
	}
	clk.Add(wait)
	if _, err := b.CheckUser(7, ClassRead); err != nil {
		t.Fatalf("b once the debt is paid: %v", err)
	}
	// A gateway that never saw the key keeps no bucket for it.
	c := fleetOf(t, 1, clk, Limit{RPS: 10, Burst: 10})[0]
	for range 3 {
		a.CheckUser(8, ClassRead) //nolint:errcheck // spend only
	}
	exchange(t, []*Guard{a, c}, clk.Now())
	if _, held := c.users.tokens(userKey{0, 8}, clk.Now()); held {
		t.Error("a spend message made a bucket on a gateway that had none")
	}
}

// TestFleetClassesByName: gateways number their route classes in the order
// they met them; a class's spend reaches the same class elsewhere.
func TestFleetClassesByName(t *testing.T) {
	clk := newFakeClock()
	gs := fleetOf(t, 2, clk, Limit{RPS: 10, Burst: 10})
	a, b := gs[0], gs[1]
	one := func(classes ...string) Settings {
		st := a.Settings()
		st.RateLimit.Classes = map[string]ClassLimits{}
		for _, c := range classes {
			st.RateLimit.Classes[c] = ClassLimits{PerUser: &Limit{RPS: 1, Burst: 4}}
		}
		return st
	}
	a.Apply(one("x"))
	a.Apply(one("x", "y"))
	b.Apply(one("y"))
	b.Apply(one("x", "y"))
	if ax, bx := a.classIDs["x"], b.classIDs["x"]; ax == bx {
		t.Fatalf("class x has id %d on both gateways; the test needs them to differ", ax)
	}
	b.CheckUser(7, "x") //nolint:errcheck // b holds x's and y's buckets
	b.CheckUser(7, "y") //nolint:errcheck
	for range 3 {
		if _, err := a.CheckUser(7, "x"); err != nil {
			t.Fatal(err)
		}
	}
	exchange(t, gs, clk.Now())
	if got, _ := b.users.tokens(userKey{b.classIDs["x"], 7}, clk.Now()); got != 0 {
		t.Errorf("b's class x tokens = %v, want 0 (4 - 1 - 3)", got)
	}
	if got, _ := b.users.tokens(userKey{b.classIDs["y"], 7}, clk.Now()); got != 3 {
		t.Errorf("b's class y tokens = %v, want 3 (untouched)", got)
	}
}

// TestSpendAddrKeys: per-address and per-prefix spend of IPv4 and IPv6
// clients is shared, each on its own rule.
func TestSpendAddrKeys(t *testing.T) {
	clk := newFakeClock()
	gs := fleetOf(t, 2, clk, Limit{})
	for _, g := range gs {
		st := g.Settings()
		st.RateLimit.PerIP = Limit{RPS: 1, Burst: 5}
		st.RateLimit.PerPrefix = Limit{RPS: 1, Burst: 8}
		g.Apply(st)
	}
	a, b := gs[0], gs[1]
	for _, s := range []string{"198.51.100.7", "2001:db8::7"} {
		ip := netip.MustParseAddr(s)
		b.CheckAddr(ip, ClassRead) //nolint:errcheck // b holds the buckets
		for range 2 {
			if _, err := a.CheckAddr(ip, ClassRead); err != nil {
				t.Fatal(err)
			}
		}
	}
	exchange(t, gs, clk.Now())
	for _, s := range []string{"198.51.100.7", "2001:db8::7"} {
		ip := netip.MustParseAddr(s)
		p, _ := addrPrefix(ip)
		if got, _ := b.ips.tokens(addrKey{0, ip}, clk.Now()); got != 2 {
			t.Errorf("%s: b's address tokens = %v, want 2", s, got)
		}
		if got, _ := b.prefixes.tokens(addrKey{0, p}, clk.Now()); got != 5 {
			t.Errorf("%s: b's prefix tokens = %v, want 5", s, got)
		}
	}
}

func spendSample() spendMsg {
	return spendMsg{
		from:    "abc",
		classes: map[uint8]string{1: "purchase", 3: "join"},
		entries: []spendEntry{
			{kind: kindIP4, addr: netip.MustParseAddr("10.0.0.1"), n: 3},
			{kind: kindIP6, cls: 1, addr: netip.MustParseAddr("2001:db8::1"), n: 1},
			{kind: kindPrefix4, cls: 3, addr: netip.MustParseAddr("10.0.0.0"), n: 300},
			{kind: kindPrefix6, addr: netip.MustParseAddr("2001:db8::"), n: 2},
			{kind: kindUser, cls: 1, user: -5, n: maxSpendPerKey},
			{kind: kindUser, user: math.MaxInt64, n: 1},
		},
	}
}

func encodeSpend(m spendMsg) [][]byte {
	var w spendWriter
	w.begin(m.from, m.classes)
	for _, e := range m.entries {
		w.add(e)
	}
	return w.finish()
}

func TestParseSpend(t *testing.T) {
	want := spendSample()
	raw := encodeSpend(want)
	if len(raw) != 1 {
		t.Fatalf("%d messages, want 1", len(raw))
	}
	got, err := parseSpend(raw[0])
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v, %v\nwant %+v", got, err, want)
	}
	msg := raw[0]
	bad := []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"magic", append([]byte("fs2"), msg[3:]...)},
		{"truncated header", msg[:5]},
		{"truncated entry", msg[:len(msg)-2]},
		{"unknown kind", append(append([]byte{}, msg...), 9, 0, 1)},
		{"unknown class", append(append([]byte{}, msg...), kindUser, 2, 0, 0, 0, 0, 0, 0, 0, 1, 1)},
		{"zero spend", append(append([]byte{}, msg...), kindUser, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0)},
		{"huge spend", append(append([]byte{}, msg...), kindUser, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f)},
		{"mapped v6", append(append([]byte{}, msg...), append([]byte{kindIP6, 0}, append(netip.MustParseAddr("::ffff:10.0.0.1").AsSlice(), 1)...)...)},
		{"no sender", []byte("fs1\x00\x00")},
		{"class zero", []byte("fs1\x01a\x01\x00\x01x")},
		{"duplicate class", []byte("fs1\x01a\x02\x01\x01x\x01\x01y")},
		{"too long", append(append([]byte{}, msg...), make([]byte, maxSpendMsg)...)},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			if m, err := parseSpend(tt.p); !errors.Is(err, errSpendMalformed) {
				t.Errorf("parse = %+v, %v; want errSpendMalformed", m, err)
			}
		})
	}
}

// TestSpendWriterSplits: many keys make several messages, each under the
// size limit and each parsing on its own.
func TestSpendWriterSplits(t *testing.T) {
	var w spendWriter
	w.begin("me", nil)
	const keys = 20000
	for i := range keys {
		w.add(spendEntry{kind: kindUser, user: int64(i), n: 2})
	}
	w.add(spendEntry{kind: kindUser, user: -1, n: 3*maxSpendPerKey + 1})
	total, entries := uint64(0), 0
	msgs := w.finish()
	if len(msgs) < 2 {
		t.Fatalf("%d messages, want several", len(msgs))
	}
	for _, raw := range msgs {
		if len(raw) > maxSpendMsg {
			t.Errorf("message of %d bytes, limit %d", len(raw), maxSpendMsg)
		}
		m, err := parseSpend(raw)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range m.entries {
			total += uint64(e.n)
			entries++
		}
	}
	if want := uint64(2*keys + 3*maxSpendPerKey + 1); total != want {
		t.Errorf("spend carried %d, want %d", total, want)
	}
}

func FuzzParseSpend(f *testing.F) {
	for _, raw := range encodeSpend(spendSample()) {
		f.Add(raw)
	}
	f.Add([]byte("fs1\x01a\x00"))
	f.Add([]byte("fs1\x01a\x01\x01\x01x\x05\x01\x00\x00\x00\x00\x00\x00\x00\x07\x01"))
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := parseSpend(p)
		if err != nil {
			return
		}
		// What parses re-encodes to what parses the same.
		raw := encodeSpend(m)
		if len(m.entries) == 0 {
			return
		}
		var again spendMsg
		for i, r := range raw {
			mm, err := parseSpend(r)
			if err != nil {
				t.Fatalf("re-encoded message %d does not parse: %v", i, err)
			}
			again.from, again.classes = mm.from, mm.classes
			again.entries = append(again.entries, mm.entries...)
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", again, m)
		}
	})
}

// TestFleetOverRedis: two Guards running against one Redis share their
// spend over pub/sub and each one's Counters sums both with per-gateway
// detail; the one stopped cleanly drops out of the other's sum.
func TestFleetOverRedis(t *testing.T) {
	rdb := testenv.Redis(t)
	store := NewStore(testenv.Postgres(t), rdb, nil)
	ctx := context.Background()
	st := DefaultSettings()
	st.RateLimit.PerUser = Limit{RPS: 1, Burst: 50}
	st.Shadow = nil
	if _, err := store.Put(ctx, "1", st); err != nil {
		t.Fatal(err)
	}
	start := func(id string) (*Guard, context.CancelFunc, chan error) {
		g := NewGuard(GuardConfig{PowKey: []byte("k"), GatewayID: id, ShareInterval: 20 * time.Millisecond, PollInterval: 50 * time.Millisecond}, rdb, nil, nil)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- g.Run(rctx, store) }()
		t.Cleanup(func() { cancel(); <-done })
		return g, cancel, done
	}
	a, stopA, doneA := start("gw-a")
	b, _, _ := start("gw-b")
	user := int64(7001)
	poll(t, "settings applied", func() bool {
		return a.Settings().Version == b.Settings().Version && a.Settings().RateLimit.PerUser.Burst == 50
	})
	if _, err := b.CheckUser(user, ClassRead); err != nil { // b holds a bucket
		t.Fatal(err)
	}
	for range 20 {
		if _, err := a.CheckUser(user, ClassRead); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, "a's spend taken off b's bucket", func() bool {
		tok, _ := b.users.tokens(userKey{0, user}, time.Now())
		return tok < 31 // 50 - 1 - 20, plus what the refill gave back since
	})

	limited := func(g *Guard) (sum uint64, per map[string]uint64) {
		for _, c := range g.Counters() {
			if c.Rule == RulePerUser && c.Outcome == OutcomeAllowed {
				return c.Count, c.Gateways
			}
		}
		return 0, nil
	}
	poll(t, "b's figures include a's", func() bool {
		sum, per := limited(b)
		return sum == 21 && per["gw-a"] == 20 && per["gw-b"] == 1
	})
	stopA()
	<-doneA
	doneA <- nil // for the cleanup
	poll(t, "a drops out of b's figures", func() bool {
		sum, per := limited(b)
		_, still := per["gw-a"]
		return sum == 1 && !still
	})
}

// poll waits for cond; the deadline only guards against a hang.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, 30*time.Second, cond)
}
