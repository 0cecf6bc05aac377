package admission

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

func signer(t testing.TB, keys ...Key) *Signer {
	t.Helper()
	s, err := NewSigner(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var (
	k1 = Key{ID: 1, Secret: []byte("0123456789abcdef-one")}
	k2 = Key{ID: 2, Secret: []byte("0123456789abcdef-two")}
)

func TestVerify(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	s := signer(t, k1)
	good := s.Sign(flashsale.Admission{UserID: 42, SaleID: 7, ExpiresAt: now.Add(time.Minute)})
	other := signer(t, Key{ID: 1, Secret: []byte("another-secret-of-16b")})
	early := s.Sign(flashsale.Admission{UserID: 42, SaleID: 7, ExpiresAt: now.Add(time.Minute), NotBefore: now.Add(time.Second)})
	v1 := signV1(t, k1, 42, 7, now.Add(time.Minute))
	flipped := []byte(good)
	if flipped[30] == 'A' {
		flipped[30] = 'B'
	} else {
		flipped[30] = 'A'
	}
	tests := []struct {
		name    string
		token   string
		user    int64
		sale    int64
		at      time.Time
		wantErr bool
	}{
		{"valid", good, 42, 7, now, false},
		{"other user", good, 43, 7, now, true},
		{"other sale", good, 42, 8, now, true},
		{"expired", good, 42, 7, now.Add(time.Minute), true},
		{"tampered", string(flipped), 42, 7, now, true},
		{"empty", "", 42, 7, now, true},
		{"garbage", strings.Repeat("!", encodedLen), 42, 7, now, true},
		{"too long", good + "A", 42, 7, now, true},
		{"not yet valid", early, 42, 7, now, true},
		{"valid from not-before", early, 42, 7, now.Add(time.Second), false},
		{"version 1", v1, 42, 7, now, false},
		{"foreign key", other.Sign(flashsale.Admission{UserID: 42, SaleID: 7, ExpiresAt: now.Add(time.Minute)}), 42, 7, now, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := s.Verify(tt.token, tt.user, tt.sale, tt.at)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Verify err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				if got := flashsale.ErrorCode(err); got != flashsale.CodeNotAdmitted {
					t.Fatalf("code = %s, want NOT_ADMITTED", got)
				}
				return
			}
			if a.UserID != 42 || a.SaleID != 7 || !a.ExpiresAt.Equal(now.Add(time.Minute)) ||
				(tt.token == early) != !a.NotBefore.IsZero() {
				t.Fatalf("got %+v", a)
			}
		})
	}
}

// signV1 builds a version 1 token (no not-before), as signers before
// version 2 made them.
func signV1(t testing.TB, k Key, user, sale int64, exp time.Time) string {
	t.Helper()
	raw := make([]byte, v1BodyLen, v1RawLen)
	raw[0], raw[1] = 1, k.ID
	binary.BigEndian.PutUint64(raw[2:], uint64(user))
	binary.BigEndian.PutUint64(raw[10:], uint64(sale))
	binary.BigEndian.PutUint64(raw[18:], uint64(exp.UnixMilli()))
	m := hmac.New(sha256.New, k.Secret)
	m.Write(raw)
	raw = append(raw, m.Sum(nil)[:macLen]...)
	return base64.RawURLEncoding.EncodeToString(raw)
}

func TestNotBeforeRoundTrip(t *testing.T) {
	s := signer(t, k1)
	nb := time.UnixMilli(1_800_000_003_000)
	a, err := s.Parse(s.Sign(flashsale.Admission{UserID: 1, SaleID: 2, ExpiresAt: nb.Add(time.Minute), NotBefore: nb}))
	if err != nil || !a.NotBefore.Equal(nb) {
		t.Fatalf("Parse = %+v, %v; want not-before %v", a, err, nb)
	}
}

func TestRotation(t *testing.T) {
	now := time.Now()
	old := signer(t, k1)
	tok := old.Sign(flashsale.Admission{UserID: 1, SaleID: 2, ExpiresAt: now.Add(time.Hour)})
	rotated := signer(t, k2, k1)
	if _, err := rotated.Verify(tok, 1, 2, now); err != nil {
		t.Fatalf("token of the old key refused after rotation: %v", err)
	}
	newTok := rotated.Sign(flashsale.Admission{UserID: 1, SaleID: 2, ExpiresAt: now.Add(time.Hour)})
	if _, err := old.Verify(newTok, 1, 2, now); err == nil {
		t.Fatal("a signer without key 2 accepted its token")
	}
	if _, err := NewSigner(Key{ID: 1, Secret: []byte("short")}); err == nil {
		t.Fatal("short key accepted")
	}
}

func TestVerifyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; allocation counts are checked without -race (make bench)")
	}
	s := signer(t, k1)
	now := time.Now()
	tok := s.Sign(flashsale.Admission{UserID: 42, SaleID: 7, ExpiresAt: now.Add(time.Minute), NotBefore: now.Add(-time.Second)})
	s.Verify(tok, 42, 7, now) // warm the pool
	if n := testing.AllocsPerRun(100, func() { s.Verify(tok, 42, 7, now) }); n > 0 {
		t.Fatalf("Verify allocates %.1f times per call, want 0", n)
	}
}

func FuzzParse(f *testing.F) {
	s := signer(f, k1)
	f.Add(s.Sign(flashsale.Admission{UserID: 1, SaleID: 1, ExpiresAt: time.UnixMilli(1)}))
	f.Add("")
	f.Add(strings.Repeat("A", encodedLen))
	f.Add(s.Sign(flashsale.Admission{UserID: 1, SaleID: 1, ExpiresAt: time.UnixMilli(9), NotBefore: time.UnixMilli(5)}))
	f.Add(signV1(f, k1, 3, 4, time.UnixMilli(7)))
	f.Fuzz(func(t *testing.T, tok string) {
		a, err := s.Parse(tok)
		if err != nil {
			return
		}
		// Anything accepted must round-trip to the same token (a version 1
		// token to the same assertion: new tokens are version 2).
		if len(tok) == v1EncodedLen {
			b, err := s.Parse(s.Sign(a))
			if err != nil || b != a {
				t.Fatalf("accepted v1 %q as %+v but its v2 parses to %+v, %v", tok, a, b, err)
			}
			return
		}
		if got := s.Sign(a); got != tok {
			t.Fatalf("accepted %q but it signs back to %q", tok, got)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	s := signer(b, k1)
	now := time.Now()
	tok := s.Sign(flashsale.Admission{UserID: 42, SaleID: 7, ExpiresAt: now.Add(time.Minute)})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Verify(tok, 42, 7, now); err != nil {
			b.Fatal(err)
		}
	}
}
