package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale"
)

const secret = "test-secret"

func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	v := NewVerifier(secret, WithClock(func() time.Time { return now }))
	mint := func(sec string, user int64, op bool, ttl time.Duration) string {
		s, err := Mint(sec, user, op, ttl, now)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	sign := func(c jwt.Claims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "5", "exp": now.Add(time.Hour).Unix()}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	tests := []struct {
		name   string
		token  string
		wantID int64
		wantOp bool
	}{
		{"shopper", mint(secret, 42, false, time.Hour), 42, false},
		{"operator", mint(secret, 7, true, time.Hour), 7, true},
		{"expired", mint(secret, 42, false, -time.Minute), 0, false},
		{"other secret", mint("other", 42, false, time.Hour), 0, false},
		{"no exp", sign(jwt.MapClaims{"sub": "42"}), 0, false},
		{"sub not a number", sign(jwt.MapClaims{"sub": "bob", "exp": now.Add(time.Hour).Unix()}), 0, false},
		{"sub negative", sign(jwt.MapClaims{"sub": "-3", "exp": now.Add(time.Hour).Unix()}), 0, false},
		{"alg none", none, 0, false},
		{"empty", "", 0, false},
		{"garbage", "a.b.c", 0, false},
		{"huge", strings.Repeat("a", MaxTokenLen+1), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := v.Verify(tt.token)
			if tt.wantID == 0 {
				if flashsale.ErrorCode(err) != flashsale.CodeUnauthenticated {
					t.Fatalf("err = %v, want UNAUTHENTICATED", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.UserID != tt.wantID || p.Operator != tt.wantOp {
				t.Fatalf("got %+v, want user %d operator %v", p, tt.wantID, tt.wantOp)
			}
		})
	}
}

func TestPublicKey(t *testing.T) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": "9", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewVerifier(secret).Verify(tok); err == nil {
		t.Fatal("ES256 token accepted without a configured public key")
	}
	p, err := NewVerifier(secret, WithPublicKey(&k.PublicKey)).Verify(tok)
	if err != nil || p.UserID != 9 {
		t.Fatalf("got %+v, %v; want user 9", p, err)
	}
}

func FuzzVerify(f *testing.F) {
	v := NewVerifier(secret)
	good, _ := Mint(secret, 1, false, time.Hour, time.Now())
	f.Add(good)
	f.Add("")
	f.Add("eyJhbGciOiJIUzI1NiJ9.e30.x")
	f.Fuzz(func(t *testing.T, tok string) {
		p, err := v.Verify(tok)
		if err == nil && p.UserID <= 0 {
			t.Fatalf("accepted %q with user %d", tok, p.UserID)
		}
	})
}

func TestCache(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	v := NewVerifier(secret, WithClock(func() time.Time { return now }))
	c := NewCache(v, 64)
	tok, err := Mint(secret, 42, true, time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // miss, then hit
		p, err := c.Verify(tok)
		if err != nil || p.UserID != 42 || !p.Operator {
			t.Fatalf("round %d: got %+v, %v", i, p, err)
		}
	}
	// Past exp (and the leeway) a cached token is refused like any other.
	now = now.Add(time.Minute + leeway)
	if _, err := c.Verify(tok); flashsale.ErrorCode(err) != flashsale.CodeUnauthenticated {
		t.Fatalf("expired cached token: err = %v, want UNAUTHENTICATED", err)
	}
	// Forged tokens never enter the cache, and the cache stays bounded.
	forged, _ := Mint("other", 7, false, time.Hour, now)
	if _, err := c.Verify(forged); err == nil {
		t.Fatal("forged token accepted")
	}
	for i := int64(1); i <= 500; i++ {
		tok, _ := Mint(secret, i, false, time.Hour, now)
		if _, err := c.Verify(tok); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for i := range c.shards {
		c.shards[i].m.Range(func(any, any) bool { n++; return true })
	}
	if n > 64 {
		t.Fatalf("cache holds %d tokens, bound 64", n)
	}
}

func BenchmarkCacheHit(b *testing.B) {
	v := NewVerifier(secret)
	c := NewCache(v, 1<<16)
	tok, _ := Mint(secret, 42, false, time.Hour, time.Now())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}

func TestSubjectAndLifetime(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	sign := func(c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte("k"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	exp := now.Add(time.Hour).Unix()
	tests := []struct {
		name   string
		claims jwt.MapClaims
		max    time.Duration
		ok     bool
	}{
		{"canonical", jwt.MapClaims{"sub": "42", "exp": exp}, 0, true},
		{"leading zero", jwt.MapClaims{"sub": "042", "exp": exp}, 0, false},
		{"plus sign", jwt.MapClaims{"sub": "+42", "exp": exp}, 0, false},
		{"zero", jwt.MapClaims{"sub": "0", "exp": exp}, 0, false},
		{"space", jwt.MapClaims{"sub": " 42", "exp": exp}, 0, false},
		{"overflow", jwt.MapClaims{"sub": "9223372036854775808", "exp": exp}, 0, false},
		{"largest id", jwt.MapClaims{"sub": "9223372036854775807", "exp": exp}, 0, true},
		{"24h from iat", jwt.MapClaims{"sub": "1", "iat": now.Unix(), "exp": now.Add(24 * time.Hour).Unix()}, 0, true},
		{"over 24h from iat", jwt.MapClaims{"sub": "1", "iat": now.Add(-2 * time.Hour).Unix(), "exp": now.Add(23 * time.Hour).Unix()}, 0, false},
		{"over 24h from now", jwt.MapClaims{"sub": "1", "exp": now.Add(25 * time.Hour).Unix()}, 0, false},
		{"configured cap", jwt.MapClaims{"sub": "1", "exp": now.Add(2 * time.Hour).Unix()}, time.Hour, false},
		{"under configured cap", jwt.MapClaims{"sub": "1", "exp": now.Add(30 * time.Minute).Unix()}, time.Hour, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := NewVerifier("k", WithClock(func() time.Time { return now }), WithMaxLifetime(tc.max))
			_, err := v.Verify(sign(tc.claims))
			if got := err == nil; got != tc.ok {
				t.Errorf("Verify: err %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestRiskClaim: a token's risk claim (0 to 1) reaches the principal; one
// outside is refused; a token without one has risk 0.
func TestRiskClaim(t *testing.T) {
	now := time.Now()
	v := NewVerifier("risk-secret-0123456789abcdef", WithClock(func() time.Time { return now }))
	for _, tc := range []struct {
		risk *float64
		want float64
		ok   bool
	}{{nil, 0, true}, {ptr(0.0), 0, true}, {ptr(0.75), 0.75, true}, {ptr(1.0), 1, true}, {ptr(1.5), 0, false}, {ptr(-0.1), 0, false}} {
		tok, err := MintWith("risk-secret-0123456789abcdef", 7, MintOptions{Risk: tc.risk}, time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		p, err := v.Verify(tok)
		if (err == nil) != tc.ok || err == nil && p.Risk != tc.want {
			t.Errorf("risk %v: %+v, %v; want risk %v, ok %v", tc.risk, p, err, tc.want, tc.ok)
		}
	}
}

func ptr[T any](v T) *T { return &v }
