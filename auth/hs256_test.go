package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"
)

var hs256Now = time.Unix(1_800_000_000, 0)

const hs256Header = `{"alg":"HS256","typ":"JWT"}`

// signSegments signs two segments as they are with key.
func signSegments(key, header, payload string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(header + "." + payload))
	return header + "." + payload + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// signJSON encodes a header and a payload and signs them with key.
func signJSON(key, header, payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return signSegments(key, enc([]byte(header)), enc([]byte(payload)))
}

// agree verifies tok on both paths and fails t unless the fast path's
// answer is the golang-jwt path's, or a fall back.
func agree(t *testing.T, v *Verifier, tok string) verdict {
	t.Helper()
	p, exp, vd := v.verifyHS256(tok)
	sp, sexp, err := v.verifyJWT(tok)
	switch vd {
	case accept:
		if err != nil || p != sp || !exp.Equal(sexp) {
			t.Fatalf("%q: fast accepts %+v until %v, golang-jwt: %+v until %v, %v", tok, p, exp, sp, sexp, err)
		}
	case refuse:
		if err == nil {
			t.Fatalf("%q: fast refuses, golang-jwt accepts %+v until %v", tok, sp, sexp)
		}
	}
	return vd
}

type hs256Case struct {
	name   string
	token  string
	want   verdict
	wantID int64 // accepted by verify
	wantOp bool
}

func hs256Cases(t testing.TB) []hs256Case {
	t.Helper()
	mint := func(sec string, user int64, op bool, ttl time.Duration) string {
		s, err := Mint(sec, user, op, ttl, hs256Now)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	exp := hs256Now.Add(time.Hour).Unix()
	claims := func(format string, args ...any) string {
		return signJSON(secret, hs256Header, fmt.Sprintf(format, args...))
	}
	good := mint(secret, 42, false, time.Hour)
	h, rest, _ := strings.Cut(good, ".")
	payload, sig, _ := strings.Cut(rest, ".")
	other := mint("other", 42, false, time.Hour)
	_, otherPayload, _ := strings.Cut(mint(secret, 43, false, time.Hour), ".")
	otherPayload, _, _ = strings.Cut(otherPayload, ".")
	last := strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", sig[len(sig)-1])
	oddBits := sig[:len(sig)-1] + string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last^1])
	return []hs256Case{
		{"minted shopper", good, accept, 42, false},
		{"minted operator", mint(secret, 7, true, time.Hour), accept, 7, true},
		{"typ first", signJSON(secret, `{"typ":"JWT","alg":"HS256"}`, fmt.Sprintf(`{"sub":"5","exp":%d}`, exp)), accept, 5, false},
		{"alg only", signJSON(secret, `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":"5","exp":%d}`, exp)), accept, 5, false},
		{"header with kid", signJSON(secret, `{"alg":"HS256","kid":"1","typ":"JWT"}`, fmt.Sprintf(`{"sub":"5","exp":%d}`, exp)), fallBack, 5, false},
		{"header with space", signJSON(secret, `{"alg": "HS256","typ":"JWT"}`, fmt.Sprintf(`{"sub":"5","exp":%d}`, exp)), fallBack, 5, false},
		{"HS384 header", signJSON(secret, `{"alg":"HS384","typ":"JWT"}`, fmt.Sprintf(`{"sub":"5","exp":%d}`, exp)), fallBack, 0, false},
		{"RS256 header", signJSON(secret, `{"alg":"RS256","typ":"JWT"}`, fmt.Sprintf(`{"sub":"5","exp":%d}`, exp)), fallBack, 0, false},
		{"other secret", other, refuse, 0, false},
		{"payload swapped", h + "." + otherPayload + "." + sig, refuse, 0, false},
		{"signature cut", good[:len(good)-1], refuse, 0, false},
		{"signature padded", good + "=", refuse, 0, false},
		{"signature empty", h + "." + payload + ".", refuse, 0, false},
		{"signature odd trailing bits", h + "." + payload + "." + oddBits, accept, 42, false},
		{"signature with newline", h + "." + payload + "." + sig[:10] + "\n" + sig[10:], accept, 42, false},
		{"header with newline", signSegments(secret, h[:5]+"\r\n"+h[5:], payload), accept, 42, false},
		{"payload with newline", signSegments(secret, h, payload[:5]+"\n"+payload[5:]), accept, 42, false},
		{"payload not base64", signSegments(secret, h, payload+"!"), fallBack, 0, false},
		{"two segments", h + "." + payload, fallBack, 0, false},
		{"four segments", good + ".x", fallBack, 0, false},
		{"expired", mint(secret, 42, false, -time.Minute), refuse, 0, false},
		{"within leeway", claims(`{"sub":"5","exp":%d}`, hs256Now.Add(-leeway+time.Second).Unix()), accept, 5, false},
		{"no exp", claims(`{"sub":"5"}`), refuse, 0, false},
		{"empty object", claims(`{}`), refuse, 0, false},
		{"not yet valid", claims(`{"sub":"5","nbf":%d,"exp":%d}`, hs256Now.Add(time.Minute).Unix(), exp), refuse, 0, false},
		{"valid since", claims(`{"sub":"5","nbf":%d,"exp":%d}`, hs256Now.Add(-time.Minute).Unix(), exp), accept, 5, false},
		{"decimal exp", claims(`{"sub":"5","exp":%d.75}`, exp), accept, 5, false},
		{"decimal exp rounding up", claims(`{"sub":"5","exp":%d.99999999999}`, exp), accept, 5, false},
		{"exp as string", claims(`{"sub":"5","exp":"%d"}`, exp), fallBack, 5, false},
		{"exp with exponent", claims(`{"sub":"5","exp":1.8000036e9}`), fallBack, 5, false},
		{"exp negative", claims(`{"sub":"5","exp":-1}`), fallBack, 0, false},
		{"exp leading zero", claims(`{"sub":"5","exp":0%d}`, exp), fallBack, 0, false},
		{"exp null", claims(`{"sub":"5","exp":null}`), fallBack, 0, false},
		{"exp huge", claims(`{"sub":"5","exp":1%020d}`, 0), fallBack, 0, false},
		{"issuer", claims(`{"iss":"shop","sub":"5","exp":%d}`, exp), fallBack, 5, false},
		{"audience", claims(`{"aud":["a"],"sub":"5","exp":%d}`, exp), fallBack, 5, false},
		{"upper-case key", claims(`{"SUB":"5","exp":%d}`, exp), fallBack, 5, false},
		{"duplicate sub", claims(`{"sub":"5","sub":"6","exp":%d}`, exp), fallBack, 6, false},
		{"escaped sub", claims(`{"sub":"\u0035","exp":%d}`, exp), fallBack, 5, false},
		{"whitespace", claims(`{ "sub":"5","exp":%d}`, exp), fallBack, 5, false},
		{"trailing newline", claims(`{"sub":"5","exp":%d}`+"\n", exp), fallBack, 5, false},
		{"trailing garbage", claims(`{"sub":"5","exp":%d}x`, exp), fallBack, 0, false},
		{"trailing comma", claims(`{"sub":"5","exp":%d,}`, exp), fallBack, 0, false},
		{"nested role", claims(`{"sub":"5","role":{"x":1},"exp":%d}`, exp), fallBack, 0, false},
		{"role not a string", claims(`{"sub":"5","role":1,"exp":%d}`, exp), fallBack, 0, false},
		{"role not ASCII", claims(`{"sub":"5","role":"opérateur","exp":%d}`, exp), fallBack, 5, false},
		{"role other", claims(`{"sub":"5","role":"admin","exp":%d}`, exp), accept, 5, false},
		{"sub leading zero", claims(`{"sub":"05","exp":%d}`, exp), refuse, 0, false},
		{"sub too large", claims(`{"sub":"9223372036854775808","exp":%d}`, exp), refuse, 0, false},
		{"sub largest", claims(`{"sub":"9223372036854775807","exp":%d}`, exp), accept, 9223372036854775807, false},
		{"sub number", claims(`{"sub":5,"exp":%d}`, exp), fallBack, 0, false},
		{"over cap from iat", claims(`{"sub":"5","iat":%d,"exp":%d}`, hs256Now.Add(-2*time.Hour).Unix(), hs256Now.Add(23*time.Hour).Unix()), refuse, 0, false},
		{"over cap from now", claims(`{"sub":"5","exp":%d}`, hs256Now.Add(25*time.Hour).Unix()), refuse, 0, false},
		{"identity key", claims(`{"sub":"5","idk":"c4rd-h4sh","exp":%d}`, exp), accept, 5, false},
		{"identity key too long", claims(`{"sub":"5","idk":"%s","exp":%d}`, strings.Repeat("k", MaxIdentityKeyLen+1), exp), refuse, 0, false},
		{"identity key longest", claims(`{"sub":"5","idk":"%s","exp":%d}`, strings.Repeat("k", MaxIdentityKeyLen), exp), accept, 5, false},
		{"identity key escaped", claims(`{"sub":"5","idk":"\u0041","exp":%d}`, exp), fallBack, 5, false},
		{"identity key twice", claims(`{"sub":"5","idk":"a","idk":"b","exp":%d}`, exp), fallBack, 5, false},
		{"identity key a number", claims(`{"sub":"5","idk":7,"exp":%d}`, exp), fallBack, 0, false},
	}
}

// TestVerifyIdentityKey: the idk claim reaches the principal, by either
// path, as the token holds it.
func TestVerifyIdentityKey(t *testing.T) {
	v := NewVerifier(secret, WithClock(func() time.Time { return hs256Now }))
	exp := hs256Now.Add(time.Hour).Unix()
	for _, tc := range []struct{ name, token, want string }{
		{"fast", signJSON(secret, hs256Header, fmt.Sprintf(`{"sub":"5","idk":"c4rd","exp":%d}`, exp)), "c4rd"},
		{"slow (escaped)", signJSON(secret, hs256Header, fmt.Sprintf(`{"sub":"5","idk":"\u0041b","exp":%d}`, exp)), "Ab"},
		{"none", signJSON(secret, hs256Header, fmt.Sprintf(`{"sub":"5","exp":%d}`, exp)), ""},
	} {
		p, err := v.Verify(tc.token)
		if err != nil || p.IdentityKey != tc.want {
			t.Errorf("%s: %+v, %v; want identity key %q", tc.name, p, err, tc.want)
		}
	}
	tok, err := MintIdentity(secret, 9, false, "addr-hash", time.Hour, hs256Now)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := v.Verify(tok); err != nil || p.IdentityKey != "addr-hash" || p.UserID != 9 {
		t.Errorf("minted with an identity key: %+v, %v", p, err)
	}
}

func TestVerifyHS256(t *testing.T) {
	v := NewVerifier(secret, WithClock(func() time.Time { return hs256Now }))
	for _, tc := range hs256Cases(t) {
		t.Run(tc.name, func(t *testing.T) {
			if got := agree(t, v, tc.token); got != tc.want {
				t.Errorf("fast path: got verdict %d, want %d", got, tc.want)
			}
			p, err := v.Verify(tc.token)
			if tc.wantID == 0 {
				if err == nil {
					t.Fatalf("Verify accepted %+v, want refused", p)
				}
				return
			}
			if err != nil || p.UserID != tc.wantID || p.Operator != tc.wantOp {
				t.Fatalf("Verify: got %+v, %v; want user %d operator %v", p, err, tc.wantID, tc.wantOp)
			}
		})
	}
}

func TestVerifyHS256NoSecret(t *testing.T) {
	v := NewVerifier("", WithClock(func() time.Time { return hs256Now }))
	tok := signJSON("", hs256Header, fmt.Sprintf(`{"sub":"5","exp":%d}`, hs256Now.Add(time.Hour).Unix()))
	if _, _, vd := v.verifyHS256(tok); vd != fallBack {
		t.Fatalf("got verdict %d without a secret, want fall back", vd)
	}
	if _, err := v.Verify(tok); err == nil {
		t.Fatal("token of an empty secret accepted")
	}
}

// FuzzVerifyFastMatchesSlow checks that the HS256 fast path accepts and
// refuses only what golang-jwt does. Each input is a token as it is, a
// header and payload signed with the secret (encoded first when encode,
// else taken as segments), and the payload under Mint's header, so that
// the fuzzer reaches the header check and the claims parser.
func FuzzVerifyFastMatchesSlow(f *testing.F) {
	v := NewVerifier(secret, WithClock(func() time.Time { return hs256Now }))
	exp := hs256Now.Add(time.Hour).Unix()
	for _, tc := range hs256Cases(f) {
		f.Add(tc.token, "", "", false)
	}
	enc := base64.RawURLEncoding.EncodeToString
	for _, p := range []string{
		fmt.Sprintf(`{"exp":%d,"iat":%d,"sub":"42"}`, exp, hs256Now.Unix()),
		fmt.Sprintf(`{"role":"operator","exp":%d,"iat":%d,"sub":"7"}`, exp, hs256Now.Unix()),
		fmt.Sprintf(`{"sub":"5","nbf":%d.5,"exp":%d.25}`, hs256Now.Unix(), exp),
		fmt.Sprintf(`{"iss":"x","sub":"5","exp":%d,"jti":"a"}`, exp),
		fmt.Sprintf(`{"sub":"5","exp":%d,"aud":"a"}`, exp),
		fmt.Sprintf(`{"sub":"5","Exp":%d}`, exp),
		fmt.Sprintf(`{"sub":"5","exp":%de0}`, exp),
		fmt.Sprintf(`{"sub":"5","idk":"k","exp":%d}`, exp),
	} {
		f.Add("", hs256Header, p, true)
		f.Add("", `{"alg":"HS256"}`, p, true)
		f.Add("", `{"typ":"JWT","alg":"HS256"}`, p, true)
		f.Add("", enc([]byte(hs256Header)), enc([]byte(p)), false)
	}
	f.Fuzz(func(t *testing.T, tok, header, payload string, encode bool) {
		agree(t, v, tok)
		agree(t, v, signJSON(secret, hs256Header, payload))
		if encode {
			agree(t, v, signJSON(secret, header, payload))
		} else {
			agree(t, v, signSegments(secret, header, payload))
		}
	})
}

func BenchmarkVerifyHS256(b *testing.B) {
	v := NewVerifier(secret)
	toks := make([]string, 1024) // distinct tokens, as on the cold path
	for i := range toks {
		tok, err := Mint(secret, int64(i+1), i%2 == 0, time.Hour, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		toks[i] = tok
	}
	for _, bc := range []struct {
		name   string
		verify func(string) (int64, error)
	}{
		{"fast", func(tok string) (int64, error) { p, _, err := v.verify(tok); return p.UserID, err }},
		{"golang-jwt", func(tok string) (int64, error) { p, _, err := v.verifyJWT(tok); return p.UserID, err }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := bc.verify(toks[i%len(toks)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
