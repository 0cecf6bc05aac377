package defense

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func benchGuard(b *testing.B) *Guard {
	b.Helper()
	g := NewGuard(GuardConfig{PowKey: []byte("k"), MaxKeys: 1 << 20}, nil, nil, nil)
	st := DefaultSettings()
	st.RateLimit.PerIP = Limit{RPS: 1e6, Burst: 1e6}
	st.RateLimit.PerUser = Limit{RPS: 1e6, Burst: 1e6}
	st.RateLimit.PerPrefix = Limit{RPS: 1e6, Burst: 1e6}
	st.RateLimit.Classes = map[string]ClassLimits{ClassPurchase: {PerUser: &Limit{RPS: 1e6, Burst: 1e6}}}
	st.Blocklist = Blocklist{CIDRs: []string{"203.0.113.0/24", "2001:db8:bad::/48", "198.51.100.1"}, Users: []string{"42"}}
	g.Apply(st)
	return g
}

// BenchmarkCheckAddr: the allowed path over 4096 known addresses, in
// parallel (as on the gateway). It should allocate nothing.
func BenchmarkCheckAddr(b *testing.B) {
	g := benchGuard(b)
	ips := make([]netip.Addr, 4096)
	for i := range ips {
		ips[i] = netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1})
		g.CheckAddr(ips[i], ClassPurchase) //nolint:errcheck // warm: buckets exist
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := g.CheckAddr(ips[i&4095], ClassPurchase); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkCheckAddrRefused: the refusal path (a flood) should allocate
// nothing either.
func BenchmarkCheckAddrRefused(b *testing.B) {
	g := NewGuard(GuardConfig{PowKey: []byte("k")}, nil, nil, nil)
	st := DefaultSettings()
	st.RateLimit.PerIP = Limit{RPS: 0.001, Burst: 1}
	g.Apply(st)
	ip := netip.MustParseAddr("198.51.100.9")
	g.CheckAddr(ip, ClassRead) //nolint:errcheck // spend the one token
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.CheckAddr(ip, ClassRead); err == nil {
			b.Fatal("allowed")
		}
	}
}

func BenchmarkCheckUser(b *testing.B) {
	g := benchGuard(b)
	for i := int64(0); i < 4096; i++ {
		g.CheckUser(1000+i, ClassPurchase) //nolint:errcheck // warm: buckets exist
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int64(0)
		for pb.Next() {
			if _, err := g.CheckUser(1000+i&4095, ClassPurchase); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkCheckUserShared: BenchmarkCheckUser with fleet sharing on:
// every allowed request is also counted for the spend messages, which a
// drain collects every 100ms as the gateway's share loop does.
func BenchmarkCheckUserShared(b *testing.B) {
	g := benchGuard(b)
	g.ips.share, g.prefixes.share, g.users.share = true, true, true
	for i := int64(0); i < 4096; i++ {
		g.CheckUser(1000+i, ClassPurchase) //nolint:errcheck // warm: buckets exist
	}
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				g.collectSpend()
			}
		}
	}()
	b.Cleanup(func() { close(stop); <-drained })
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int64(0)
		for pb.Next() {
			if _, err := g.CheckUser(1000+i&4095, ClassPurchase); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

func BenchmarkClientAddr(b *testing.B) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	peer := netip.MustParseAddr("10.0.0.1")
	b.ReportAllocs()
	for b.Loop() {
		if !ClientAddr(peer, "6.6.6.6, 198.51.100.9, 10.1.1.1", trusted).IsValid() {
			b.Fatal("invalid")
		}
	}
}

// BenchmarkPowVerify: the CPU cost of checking one solution (parse, HMAC,
// one hash), without the Redis call.
func BenchmarkPowVerify(b *testing.B) {
	key := []byte("bench-key")
	now := time.Now()
	ch, err := newPowChallenge(key, 1000, 1, 1, now.Add(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	sol, err := SolvePow(ch)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := checkPowSolution(key, sol, 1000, 1, 1, now); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPowVerifyRedis: CheckJoin with a valid solution, including the
// spent-marker SET NX on a real Redis.
func BenchmarkPowVerifyRedis(b *testing.B) {
	g := NewGuard(GuardConfig{PowKey: []byte("k")}, testenv.Redis(b), nil, nil)
	st := DefaultSettings()
	st.Pow.Difficulty = 1
	g.Apply(st)
	ctx := context.Background()
	sols := make([]json.RawMessage, b.N)
	for i := range sols {
		ch, err := newPowChallenge(g.cfg.PowKey, 1, 1, 1, time.Now().Add(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		if sols[i], err = SolvePow(ch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if ch, err := g.CheckJoin(ctx, testIP, 1, 1, sols[i]); ch != nil || err != nil {
			b.Fatalf("%s %v", ch, err)
		}
	}
}

// BenchmarkSolvePow: solve time per difficulty with Go's SHA-256 on one
// core (the browser figure is measured separately; see POW.md).
func BenchmarkSolvePow(b *testing.B) {
	for _, d := range []uint64{1_000, 10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("difficulty=%d", d), func(b *testing.B) {
			var tries uint64
			i := 0
			for b.Loop() {
				n, err := solve(fmt.Sprintf("%032x", i), d)
				if err != nil {
					b.Fatal(err)
				}
				tries += n + 1
				i++
			}
			b.ReportMetric(float64(tries)/b.Elapsed().Seconds(), "hashes/s")
			b.ReportMetric(float64(tries)/float64(i), "tries/op")
		})
	}
}
