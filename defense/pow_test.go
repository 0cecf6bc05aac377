package defense

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

var testIP = netip.MustParseAddr("192.0.2.10")

func newPowGuard(t *testing.T, difficulty uint64) (*Guard, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	g := NewGuard(GuardConfig{Now: clk.Now, PowKey: []byte("test-pow-key")}, testenv.Redis(t), nil, nil)
	st := DefaultSettings()
	st.Pow.Difficulty = difficulty
	g.Apply(st)
	return g, clk
}

// challengeFor asks g for a challenge for user in sale.
func challengeFor(t *testing.T, g *Guard, user, sale int64) json.RawMessage {
	t.Helper()
	ch, err := g.CheckJoin(context.Background(), testIP, user, sale, nil)
	if err != nil || ch == nil {
		t.Fatalf("CheckJoin without a solution = %s, %v; want a challenge", ch, err)
	}
	return ch
}

func solveFor(t *testing.T, g *Guard, user, sale int64) json.RawMessage {
	t.Helper()
	sol, err := SolvePow(challengeFor(t, g, user, sale))
	if err != nil {
		t.Fatal(err)
	}
	return sol
}

// edit changes fields of a solution.
func edit(t *testing.T, sol json.RawMessage, f func(m map[string]any)) json.RawMessage {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(sol))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	f(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPowChallengeForm(t *testing.T) {
	g, clk := newPowGuard(t, 1000)
	var c map[string]any
	if err := json.Unmarshal(challengeFor(t, g, 1, 7), &c); err != nil {
		t.Fatal(err)
	}
	th := powThreshold(1000)
	want := map[string]any{
		"type": "challenge", "algorithm": "SHA-256", "difficulty": 1000.0,
		"threshold":   hex.EncodeToString(th[:]),
		"expiresAtMs": float64(clk.Now().Add(DefaultPowTTL).UnixMilli()),
	}
	for k, v := range want {
		if c[k] != v {
			t.Errorf("%s = %v, want %v", k, c[k], v)
		}
	}
	if s, _ := c["salt"].(string); !isLowerHex(s, 32) {
		t.Errorf("salt %q is not 32 hex characters", s)
	}
	if s, _ := c["signature"].(string); !isLowerHex(s, 64) {
		t.Errorf("signature %q is not 64 hex characters", s)
	}
}

func TestPowSolutions(t *testing.T) {
	ctx := context.Background()
	g, clk := newPowGuard(t, 2000)
	const user, sale = 11, 7
	tests := []struct {
		name   string
		pow    func(t *testing.T) json.RawMessage
		user   int64
		sale   int64
		before func()
		reason error
	}{
		{name: "missing", pow: func(*testing.T) json.RawMessage { return nil }, reason: errPowMalformed},
		{name: "json null", pow: func(*testing.T) json.RawMessage { return json.RawMessage("null") }, reason: errPowMalformed},
		{name: "not json", pow: func(*testing.T) json.RawMessage { return json.RawMessage("{nonce") }, reason: errPowMalformed},
		{name: "too large", pow: func(t *testing.T) json.RawMessage {
			return edit(t, solveFor(t, g, user, sale), func(m map[string]any) { m["pad"] = string(make([]byte, 2000)) })
		}, reason: errPowMalformed},
		{name: "wrong nonce", pow: func(t *testing.T) json.RawMessage {
			sol := solveFor(t, g, user, sale)
			var s powSolution
			json.Unmarshal(sol, &s) //nolint:errcheck
			th := powThreshold(s.Difficulty)
			n := s.Nonce + 1
			for h := powHash(s.Salt, n); bytes.Compare(h[:], th[:]) < 0; h = powHash(s.Salt, n) {
				n++
			}
			return edit(t, sol, func(m map[string]any) { m["nonce"] = n })
		}, reason: errPowHash},
		{name: "forged signature", pow: func(t *testing.T) json.RawMessage {
			return edit(t, solveFor(t, g, user, sale), func(m map[string]any) { m["signature"] = hex.EncodeToString(make([]byte, 32)) })
		}, reason: errPowSignature},
		{name: "self-made challenge with lower difficulty", pow: func(t *testing.T) json.RawMessage {
			return edit(t, solveFor(t, g, user, sale), func(m map[string]any) { m["difficulty"] = 1 })
		}, reason: errPowDifficulty},
		{name: "raised difficulty claim", pow: func(t *testing.T) json.RawMessage {
			return edit(t, solveFor(t, g, user, sale), func(m map[string]any) { m["difficulty"] = 3000 })
		}, reason: errPowSignature},
		{name: "extended expiry", pow: func(t *testing.T) json.RawMessage {
			return edit(t, solveFor(t, g, user, sale), func(m map[string]any) { m["expiresAtMs"] = clk.Now().Add(time.Hour).UnixMilli() })
		}, reason: errPowSignature},
		{name: "other salt", pow: func(t *testing.T) json.RawMessage {
			return edit(t, solveFor(t, g, user, sale), func(m map[string]any) { m["salt"] = "00000000000000000000000000000000" })
		}, reason: errPowSignature},
		{name: "wrong algorithm", pow: func(t *testing.T) json.RawMessage {
			return edit(t, solveFor(t, g, user, sale), func(m map[string]any) { m["algorithm"] = "SHA-1" })
		}, reason: errPowMalformed},
		{name: "another user's solution", pow: func(t *testing.T) json.RawMessage { return solveFor(t, g, 12, sale) }, reason: errPowSignature},
		{name: "another sale's solution", pow: func(t *testing.T) json.RawMessage { return solveFor(t, g, user, 8) }, reason: errPowSignature},
		{name: "expired", pow: func(t *testing.T) json.RawMessage {
			sol := solveFor(t, g, user, sale)
			clk.Add(DefaultPowTTL)
			return sol
		}, reason: errPowExpired},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sol := tc.pow(t)
			if len(sol) > 0 && len(sol) <= powMaxSolution {
				_, err := checkPowSolution(g.cfg.PowKey, sol, 2000, user, sale, clk.Now())
				if !errors.Is(err, tc.reason) {
					t.Errorf("reason = %v, want %v", err, tc.reason)
				}
			}
			ch, err := g.CheckJoin(ctx, testIP, user, sale, sol)
			if err != nil || ch == nil {
				t.Errorf("CheckJoin = %s, %v; want a new challenge", ch, err)
			}
		})
	}
	// A correct solution passes once, then is spent.
	sol := solveFor(t, g, user, sale)
	if ch, err := g.CheckJoin(ctx, testIP, user, sale, sol); ch != nil || err != nil {
		t.Fatalf("correct solution: %s, %v; want a pass", ch, err)
	}
	if ch, err := g.CheckJoin(ctx, testIP, user, sale, sol); ch == nil || err != nil {
		t.Fatalf("reused solution: %s, %v; want a new challenge", ch, err)
	}
	// Other gateways (same key, same Redis) see it spent too.
	g2 := NewGuard(GuardConfig{Now: clk.Now, PowKey: []byte("test-pow-key")}, g.rdb, nil, nil)
	g2.Apply(g.Settings())
	if ch, err := g2.CheckJoin(ctx, testIP, user, sale, sol); ch == nil || err != nil {
		t.Fatalf("reused on another gateway: %s, %v; want a new challenge", ch, err)
	}
	sol = solveFor(t, g, user, sale)
	if ch, err := g2.CheckJoin(ctx, testIP, user, sale, sol); ch != nil || err != nil {
		t.Fatalf("fresh solution on another gateway: %s, %v; want a pass", ch, err)
	}
	if got := counter(g, RulePow, OutcomeAllowed); got != 1 {
		t.Errorf("pow allowed = %d, want 1", got)
	}
	if got := counter(g, RulePow, OutcomeChallenged); got < uint64(len(tests)) {
		t.Errorf("pow challenged = %d, want ≥ %d", got, len(tests))
	}
}

func TestPowOffAndEasierAfterChange(t *testing.T) {
	ctx := context.Background()
	g, _ := newPowGuard(t, 0)
	if ch, err := g.CheckJoin(ctx, testIP, 1, 1, nil); ch != nil || err != nil {
		t.Fatalf("difficulty 0: %s, %v; want a pass", ch, err)
	}
	st := g.Settings()
	st.Pow.Difficulty = 100
	g.Apply(st)
	easy := solveFor(t, g, 1, 1)
	st.Pow.Difficulty = 5000
	g.Apply(st)
	if ch, _ := g.CheckJoin(ctx, testIP, 1, 1, easy); ch == nil {
		t.Error("a solution easier than the current difficulty passed")
	}
	hard := solveFor(t, g, 1, 1)
	st.Pow.Difficulty = 100
	g.Apply(st)
	if ch, err := g.CheckJoin(ctx, testIP, 1, 1, hard); ch != nil || err != nil {
		t.Errorf("a harder solution after lowering: %s, %v; want a pass", ch, err)
	}
}

func TestPowRedisDown(t *testing.T) {
	clk := newFakeClock()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	g := NewGuard(GuardConfig{Now: clk.Now, PowKey: []byte("k")}, rdb, nil, nil)
	st := DefaultSettings()
	st.Pow.Difficulty = 10
	g.Apply(st)
	sol := solveFor(t, g, 1, 1)
	ch, err := g.CheckJoin(context.Background(), testIP, 1, 1, sol)
	if ch != nil || flashsale.ErrorCode(err) != flashsale.CodeUnavailable {
		t.Errorf("CheckJoin = %s, %v; want UNAVAILABLE", ch, err)
	}
}

func TestPowThresholdIsLinear(t *testing.T) {
	two256 := new(big.Int).Lsh(big.NewInt(1), 256)
	for _, d := range []uint64{2, 3, 1000, 1_500_000, 1 << 40} {
		th := powThreshold(d)
		x := new(big.Int).SetBytes(th[:])
		lo := new(big.Int).Mul(x, new(big.Int).SetUint64(d))
		hi := new(big.Int).Mul(new(big.Int).Add(x, big.NewInt(1)), new(big.Int).SetUint64(d))
		if lo.Cmp(two256) > 0 || hi.Cmp(two256) <= 0 {
			t.Errorf("threshold(%d) is not floor(2^256/%d)", d, d)
		}
	}
	// Expected work equals difficulty: the mean number of tries over fixed
	// salts (deterministic) is near the difficulty and scales linearly.
	mean := func(d uint64) float64 {
		var sum uint64
		const n = 300
		for i := 0; i < n; i++ {
			nonce, err := solve(fmt.Sprintf("%032x", i), d)
			if err != nil {
				t.Fatal(err)
			}
			sum += nonce + 1
		}
		return float64(sum) / n
	}
	m1, m4 := mean(1000), mean(4000)
	if m1 < 700 || m1 > 1300 {
		t.Errorf("mean tries at difficulty 1000 = %.0f, want about 1000", m1)
	}
	if r := m4 / m1; r < 2.8 || r > 5.2 {
		t.Errorf("difficulty ×4 costs ×%.2f, want about ×4", r)
	}
}

func FuzzPowSolution(f *testing.F) {
	key := []byte("fuzz-key")
	now := time.UnixMilli(1_800_000_000_000)
	ch, err := newPowChallenge(key, 50, 1, 1, now.Add(time.Minute))
	if err != nil {
		f.Fatal(err)
	}
	sol, err := SolvePow(ch)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(sol))
	f.Add([]byte(ch))
	f.Add([]byte(`{"algorithm":"SHA-256","salt":"00000000000000000000000000000000","difficulty":1,"expiresAtMs":1,"signature":"","nonce":1e99}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		// The seeds are solved for user 1; user 2 must never pass.
		if _, err := checkPowSolution(key, raw, 1, 2, 1, now); err == nil {
			t.Fatalf("accepted a solution for another user: %s", raw)
		}
		s, err := checkPowSolution(key, raw, 1, 1, 1, now)
		if err == nil && (s.Difficulty < 1 || !isLowerHex(s.Salt, 32)) {
			t.Fatalf("accepted a malformed solution: %s", raw)
		}
	})
}
