package defense

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale"
)

// newTestGuard returns a Guard on a fake clock enforcing st.
func newTestGuard(t *testing.T, st Settings) (*Guard, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	g := NewGuard(GuardConfig{Now: clk.Now, PowKey: []byte("test-pow-key"), MaxKeys: 10_000}, nil, nil, nil)
	if err := st.Validate(); err != nil {
		t.Fatalf("test settings invalid: %v", err)
	}
	g.Apply(st)
	return g, clk
}

func limits(ip, prefix, user Limit) Settings {
	st := DefaultSettings()
	st.RateLimit.PerIP, st.RateLimit.PerPrefix, st.RateLimit.PerUser = ip, prefix, user
	return st
}

func counter(g *Guard, rule, outcome string) uint64 {
	for _, c := range g.Counters() {
		if c.Rule == rule && c.Outcome == outcome {
			return c.Count
		}
	}
	return 0
}

// requests runs n requests through CheckAddr then CheckUser, as the gateway
// does, and returns how many were refused by RATE_LIMITED.
func requests(t *testing.T, g *Guard, n int, ip func(i int) netip.Addr, user func(i int) int64) (limited int) {
	t.Helper()
	for i := 0; i < n; i++ {
		d, err := g.CheckAddr(ip(i), ClassPurchase)
		if err == nil {
			d, err = g.CheckUser(user(i), ClassPurchase)
		}
		switch flashsale.ErrorCode(err) {
		case "":
		case flashsale.CodeRateLimited:
			if d <= 0 {
				t.Fatalf("request %d: RATE_LIMITED without a Retry-After", i)
			}
			limited++
		default:
			t.Fatalf("request %d: unexpected error %v", i, err)
		}
	}
	return limited
}

func TestRateLimitRules(t *testing.T) {
	off := Limit{}
	one := func(int) netip.Addr { return netip.MustParseAddr("198.51.100.7") }
	users := func(i int) int64 { return int64(1000 + i) }
	// 500 addresses on 500 different /24s (and /64s): only the user rule
	// can see them as one client.
	spreadV4 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i % 256), 1}) }
	spreadV6 := func(i int) netip.Addr {
		return netip.MustParseAddr(fmt.Sprintf("2001:db8:%x:%x::1", i/256, i%256))
	}
	sameV4Prefix := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{203, 0, 113, byte(i % 250)}) }
	sameV6Prefix := func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("2001:db8:1:2::%x", i+1)) }
	oneUser := func(int) int64 { return 42 }
	tests := []struct {
		name        string
		st          Settings
		ip          func(int) netip.Addr
		user        func(int) int64
		wantLimited int
		wantRule    string
	}{
		{"one address, 500 users: per-IP rule", limits(Limit{RPS: 1, Burst: 50}, off, Limit{RPS: 1, Burst: 5}), one, users, 450, RulePerIP},
		{"one address, 500 users: per-prefix rule", limits(off, Limit{RPS: 1, Burst: 50}, Limit{RPS: 1, Burst: 5}), one, users, 450, RulePerPrefix},
		{"one /24, 250 addresses, 500 users: per-prefix rule", limits(Limit{RPS: 1, Burst: 5}, Limit{RPS: 1, Burst: 100}, Limit{RPS: 1, Burst: 5}), sameV4Prefix, users, 400, RulePerPrefix},
		{"one /64, 500 addresses: per-prefix rule", limits(Limit{RPS: 1, Burst: 5}, Limit{RPS: 1, Burst: 100}, off), sameV6Prefix, users, 400, RulePerPrefix},
		{"500 ipv4 addresses, one user: per-user rule", limits(Limit{RPS: 1, Burst: 5}, Limit{RPS: 1, Burst: 5}, Limit{RPS: 1, Burst: 10}), spreadV4, oneUser, 490, RulePerUser},
		{"500 ipv6 addresses, one user: per-user rule", limits(Limit{RPS: 1, Burst: 5}, Limit{RPS: 1, Burst: 5}, Limit{RPS: 1, Burst: 10}), spreadV6, oneUser, 490, RulePerUser},
		{"all rules off", limits(off, off, off), one, oneUser, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, _ := newTestGuard(t, tc.st)
			got := requests(t, g, 500, tc.ip, tc.user)
			if got != tc.wantLimited {
				t.Errorf("limited = %d, want %d", got, tc.wantLimited)
			}
			for _, r := range []string{RulePerIP, RulePerPrefix, RulePerUser} {
				n := counter(g, r, OutcomeLimited)
				if r == tc.wantRule && n != uint64(tc.wantLimited) {
					t.Errorf("rule %s limited %d, want %d", r, n, tc.wantLimited)
				}
				if r != tc.wantRule && n != 0 {
					t.Errorf("rule %s limited %d, want 0 (the test isolates %s)", r, n, tc.wantRule)
				}
			}
		})
	}
}

func TestRetryAfterAndRefill(t *testing.T) {
	g, clk := newTestGuard(t, limits(Limit{RPS: 2, Burst: 2}, Limit{}, Limit{}))
	ip := netip.MustParseAddr("198.51.100.7")
	for i := 0; i < 2; i++ {
		if _, err := g.CheckAddr(ip, ClassRead); err != nil {
			t.Fatalf("request %d within burst: %v", i, err)
		}
	}
	d, err := g.CheckAddr(ip, ClassRead)
	var fe *flashsale.Error
	if !errors.As(err, &fe) || fe.Code != flashsale.CodeRateLimited {
		t.Fatalf("err = %v, want RATE_LIMITED", err)
	}
	if d != 500*time.Millisecond {
		t.Errorf("retry after %v, want 500ms (one token at 2/s)", d)
	}
	clk.Add(d)
	if _, err := g.CheckAddr(ip, ClassRead); err != nil {
		t.Errorf("after Retry-After: %v", err)
	}
	// An IPv4-mapped form of the same address shares the bucket.
	if _, err := g.CheckAddr(netip.MustParseAddr("::ffff:198.51.100.7"), ClassRead); flashsale.ErrorCode(err) != flashsale.CodeRateLimited {
		t.Errorf("mapped address: err = %v, want RATE_LIMITED (same client)", err)
	}
}

func TestClassOverrides(t *testing.T) {
	st := limits(Limit{RPS: 1, Burst: 3}, Limit{}, Limit{RPS: 1, Burst: 3})
	st.RateLimit.Classes = map[string]ClassLimits{ClassPurchase: {PerUser: &Limit{RPS: 1, Burst: 1}}}
	g, _ := newTestGuard(t, st)
	// purchase has its own per-user bucket of 1; read and join share the default of 3.
	if _, err := g.CheckUser(7, ClassPurchase); err != nil {
		t.Fatal(err)
	}
	if _, err := g.CheckUser(7, ClassPurchase); flashsale.ErrorCode(err) != flashsale.CodeRateLimited {
		t.Fatalf("second purchase: %v, want RATE_LIMITED", err)
	}
	for i, class := range []string{ClassRead, ClassJoin, "unknown-class"} {
		if _, err := g.CheckUser(7, class); err != nil {
			t.Fatalf("%s (default bucket, request %d): %v", class, i, err)
		}
	}
	if _, err := g.CheckUser(7, ClassRead); flashsale.ErrorCode(err) != flashsale.CodeRateLimited {
		t.Fatalf("4th default-bucket request: %v, want RATE_LIMITED", err)
	}
	// Tightening the default applies to existing buckets at once.
	st.RateLimit.PerIP = Limit{RPS: 1, Burst: 1}
	g.Apply(st)
	ip := netip.MustParseAddr("198.51.100.1")
	if _, err := g.CheckAddr(ip, ClassRead); err != nil {
		t.Fatal(err)
	}
	if _, err := g.CheckAddr(ip, ClassRead); flashsale.ErrorCode(err) != flashsale.CodeRateLimited {
		t.Fatalf("after tightening: %v, want RATE_LIMITED", err)
	}
}

func TestBlocklist(t *testing.T) {
	st := limits(Limit{}, Limit{}, Limit{})
	st.Blocklist = Blocklist{CIDRs: []string{"203.0.113.0/24", "2001:db8:bad::/48", "198.51.100.77"}, Users: []string{"42"}}
	st.Pow.Difficulty = 1000
	g, _ := newTestGuard(t, st)
	ctx := context.Background()
	tests := []struct {
		name  string
		ip    string
		user  int64
		block bool
	}{
		{"blocked /24", "203.0.113.200", 1, true},
		{"blocked /24 mapped", "::ffff:203.0.113.5", 1, true},
		{"blocked single address", "198.51.100.77", 1, true},
		{"neighbour of single address", "198.51.100.78", 1, false},
		{"blocked ipv6 /48", "2001:db8:bad:1::9", 1, true},
		{"other ipv6", "2001:db8:bee::1", 1, false},
		{"blocked user", "192.0.2.1", 42, true},
		{"clean", "192.0.2.1", 43, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ip := netip.MustParseAddr(tc.ip)
			_, errA := g.CheckAddr(ip, ClassRead)
			_, errU := g.CheckUser(tc.user, ClassRead)
			ch, errJ := g.CheckJoin(ctx, ip, tc.user, 7, nil)
			addrBlocked := tc.block && tc.user != 42
			if got := flashsale.ErrorCode(errA) == flashsale.CodeBlocked; got != addrBlocked {
				t.Errorf("CheckAddr blocked = %v (%v), want %v", got, errA, addrBlocked)
			}
			if got := flashsale.ErrorCode(errU) == flashsale.CodeBlocked; got != (tc.user == 42) {
				t.Errorf("CheckUser blocked = %v (%v), want %v", got, errU, tc.user == 42)
			}
			if got := flashsale.ErrorCode(errJ) == flashsale.CodeBlocked; got != tc.block {
				t.Errorf("CheckJoin blocked = %v (%v), want %v", got, errJ, tc.block)
			}
			if tc.block && ch != nil {
				t.Error("CheckJoin sent a challenge to a blocked client")
			}
			if !tc.block && ch == nil {
				t.Error("CheckJoin without a solution: no challenge")
			}
		})
	}
}

func TestShadowMode(t *testing.T) {
	st := limits(Limit{RPS: 1, Burst: 1}, Limit{RPS: 1, Burst: 1}, Limit{RPS: 1, Burst: 1})
	st.Blocklist.Users = []string{"42"}
	st.Blocklist.CIDRs = []string{"203.0.113.0/24"}
	st.Pow.Difficulty = 1000
	st.Shadow = map[string]bool{RulePerIP: true, RulePerPrefix: true, RulePerUser: true, RuleBlocklist: true, RulePow: true}
	g, _ := newTestGuard(t, st)
	ip := netip.MustParseAddr("203.0.113.9")
	for i := 0; i < 3; i++ {
		if d, err := g.CheckAddr(ip, ClassRead); err != nil || d != 0 {
			t.Fatalf("CheckAddr in shadow mode: %v, %v", d, err)
		}
		if d, err := g.CheckUser(42, ClassRead); err != nil || d != 0 {
			t.Fatalf("CheckUser in shadow mode: %v, %v", d, err)
		}
	}
	if ch, err := g.CheckJoin(context.Background(), ip, 42, 1, nil); ch != nil || err != nil {
		t.Fatalf("CheckJoin in shadow mode: %s, %v", ch, err)
	}
	want := map[[2]string]uint64{
		{RuleBlocklist, OutcomeShadow}: 7, // 3 addr + 3 user + 1 join
		{RulePerIP, OutcomeAllowed}:    1, {RulePerIP, OutcomeShadow}: 2,
		{RulePerPrefix, OutcomeAllowed}: 1, {RulePerPrefix, OutcomeShadow}: 2,
		{RulePerUser, OutcomeAllowed}: 1, {RulePerUser, OutcomeShadow}: 2,
		{RulePow, OutcomeShadow}: 1,
	}
	for _, c := range g.Counters() {
		if c.Count != want[[2]string{c.Rule, c.Outcome}] {
			t.Errorf("%s/%s = %d, want %d", c.Rule, c.Outcome, c.Count, want[[2]string{c.Rule, c.Outcome}])
		}
	}
	// Leaving shadow mode for one rule enforces it.
	delete(st.Shadow, RulePerUser)
	g.Apply(st)
	if _, err := g.CheckUser(42, ClassRead); flashsale.ErrorCode(err) != flashsale.CodeRateLimited {
		t.Errorf("per-user out of shadow mode: %v, want RATE_LIMITED", err)
	}
}

func TestLimiterMemoryBounded(t *testing.T) {
	clk := newFakeClock()
	g := NewGuard(GuardConfig{Now: clk.Now, PowKey: []byte("k"), MaxKeys: 640, IdleEvict: time.Minute}, nil, nil, nil)
	g.Apply(limits(Limit{RPS: 1, Burst: 1}, Limit{RPS: 1, Burst: 1}, Limit{RPS: 1, Burst: 1}))
	for i := 0; i < 10_000; i++ {
		ip := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}) // one per /24
		if _, err := g.CheckAddr(ip, ClassRead); err != nil {
			t.Fatal(err)
		}
		if _, err := g.CheckUser(int64(i+1), ClassRead); err != nil {
			t.Fatal(err)
		}
	}
	for name, n := range map[string]int{"ip": g.ips.len(), "prefix": g.prefixes.len(), "user": g.users.len()} {
		if n > 640 {
			t.Errorf("%s buckets = %d, want ≤ 640 (MaxKeys)", name, n)
		}
	}
	clk.Add(30 * time.Second)
	hot := netip.MustParseAddr("192.0.2.1")
	g.CheckAddr(hot, ClassRead) //nolint:errcheck // only keeps the bucket fresh
	clk.Add(31 * time.Second)
	if n := g.EvictIdle(); n == 0 {
		t.Error("EvictIdle removed nothing")
	}
	if got := g.ips.len(); got != 1 {
		t.Errorf("after eviction %d address buckets, want 1 (the recently used one)", got)
	}
	// The surviving bucket keeps its state.
	if _, err := g.CheckAddr(hot, ClassRead); err != nil {
		t.Errorf("refilled bucket: %v", err)
	}
	if _, err := g.CheckAddr(hot, ClassRead); flashsale.ErrorCode(err) != flashsale.CodeRateLimited {
		t.Errorf("bucket state lost: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := NewGuard(GuardConfig{PowKey: []byte("k")}, nil, nil, reg)
	g.Apply(limits(Limit{RPS: 1, Burst: 1}, Limit{}, Limit{}))
	ip := netip.MustParseAddr("192.0.2.1")
	g.CheckAddr(ip, ClassRead) //nolint:errcheck
	g.CheckAddr(ip, ClassRead) //nolint:errcheck
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "flashsale_defense_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var rule, outcome string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "rule":
					rule = l.GetValue()
				case "outcome":
					outcome = l.GetValue()
				}
			}
			got[rule+"/"+outcome] = m.GetCounter().GetValue()
		}
	}
	// Three outcomes for each of five rules, and shadowQueue for the
	// blocklist and proof of work.
	if len(got) != 17 {
		t.Errorf("%d rule/outcome series, want 17", len(got))
	}
	for k, want := range map[string]float64{"blocklist/allowed": 2, "perIp/allowed": 1, "perIp/limited": 1, "perUser/limited": 0} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
}

// TestDrawClassOwnBuckets: the draw record has its own per-address
// buckets at DefaultDrawPerIP when the settings name none, so reading it
// neither draws on nor is allowed by the address's other budget; a
// setting for the class replaces them.
func TestDrawClassOwnBuckets(t *testing.T) {
	ip := netip.MustParseAddr("192.0.2.7")
	g, clk := newTestGuard(t, DefaultSettings())
	burst := DefaultDrawPerIP().Burst
	for i := range burst {
		if _, err := g.CheckAddrAt(ip, ClassDraw, clk.Now()); err != nil {
			t.Fatalf("draw request %d: %v", i, err)
		}
	}
	if _, err := g.CheckAddrAt(ip, ClassDraw, clk.Now()); flashsale.ErrorCode(err) != flashsale.CodeRateLimited {
		t.Fatalf("draw request past the burst: %v, want RATE_LIMITED", err)
	}
	if _, err := g.CheckAddrAt(ip, ClassRead, clk.Now()); err != nil {
		t.Fatalf("a read after the draw burst: %v", err)
	}

	st := DefaultSettings()
	st.RateLimit.Classes = map[string]ClassLimits{ClassDraw: {PerIP: &Limit{RPS: 1, Burst: 2}}}
	g, clk = newTestGuard(t, st)
	for i := range 2 {
		if _, err := g.CheckAddrAt(ip, ClassDraw, clk.Now()); err != nil {
			t.Fatalf("draw request %d: %v", i, err)
		}
	}
	if _, err := g.CheckAddrAt(ip, ClassDraw, clk.Now()); flashsale.ErrorCode(err) != flashsale.CodeRateLimited {
		t.Fatalf("past the configured burst: %v, want RATE_LIMITED", err)
	}
}

// TestShadowQueueVerdicts: with shadowQueue rules on, a blocklisted
// shopper's join and a join with a bad proof of work are sent to the
// shadow queue (a *flashsale.Shadow naming the rule), and the blocklist
// lets the shopper's other requests through (nothing tells them); a join
// without a solution still gets its challenge, and the rules not named
// still refuse. Counted as outcome shadowQueue.
func TestShadowQueueVerdicts(t *testing.T) {
	st := DefaultSettings()
	st.Blocklist.Users = []string{"42"}
	st.Pow.Difficulty = 1000
	st.ShadowQueue = ShadowQueue{Rules: map[string]bool{ShadowBlocklist: true, ShadowPow: true}, RiskAbove: 0.5}
	g, _ := newTestGuard(t, st)
	ip := netip.MustParseAddr("198.51.100.7")
	ctx := context.Background()
	var sh *flashsale.Shadow
	if ch, err := g.CheckJoin(ctx, ip, 42, 1, nil); ch != nil || !errors.As(err, &sh) || sh.Rule != ShadowBlocklist {
		t.Fatalf("blocklisted join: %s, %v: want the shadow queue by blocklist", ch, err)
	}
	if _, err := g.CheckUser(42, ClassRead); err != nil {
		t.Fatalf("a blocklisted shopper's read, blocklist shadow-queued: %v", err)
	}
	if g.Blocked(ip, 42) {
		t.Fatal("Blocked is true for a shadow-queued blocklist: the room would close the shadow's page")
	}
	if ch, err := g.CheckJoin(ctx, ip, 7, 1, nil); ch == nil || err != nil {
		t.Fatalf("join without a solution: %s, %v: want a challenge", ch, err)
	}
	sh = nil
	if ch, err := g.CheckJoin(ctx, ip, 7, 1, json.RawMessage(`{"nonce":"1","prefix":"forged"}`)); ch != nil || !errors.As(err, &sh) || sh.Rule != ShadowPow {
		t.Fatalf("join with a forged solution: %s, %v: want the shadow queue by pow", ch, err)
	}
	if !g.Shadows(ShadowBlocklist) || !g.Shadows(ShadowPow) || g.Shadows(ShadowIdentity) || g.ShadowRisk() != 0.5 {
		t.Fatalf("Shadows/ShadowRisk do not read the settings")
	}
	got := map[[2]string]uint64{}
	for _, c := range g.Counters() {
		got[[2]string{c.Rule, c.Outcome}] = c.Count
	}
	if got[[2]string{RuleBlocklist, OutcomeShadowQueue}] != 2 || got[[2]string{RulePow, OutcomeShadowQueue}] != 1 {
		t.Fatalf("counters %v: want blocklist/shadowQueue 2, pow/shadowQueue 1", got)
	}
	// Without the rule the blocklist refuses again.
	st.ShadowQueue.Rules = map[string]bool{ShadowPow: true}
	g.Apply(st)
	if _, err := g.CheckJoin(ctx, ip, 42, 1, nil); flashsale.ErrorCode(err) != flashsale.CodeBlocked {
		t.Fatalf("blocklisted join without the rule: %v, want BLOCKED", err)
	}
}

func TestShadowQueueSettingsValidated(t *testing.T) {
	for _, q := range []ShadowQueue{
		{Rules: map[string]bool{"perIp": true}},
		{RiskAbove: 1},
		{RiskAbove: -0.1},
	} {
		st := DefaultSettings()
		st.ShadowQueue = q
		if err := st.normalize(); flashsale.ErrorCode(err) != flashsale.CodeInvalid {
			t.Errorf("%+v: %v, want INVALID", q, err)
		}
	}
}
