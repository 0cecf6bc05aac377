package auth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// idpKey is a signing key of the test identity provider.
type idpKey struct {
	kid    string
	method jwt.SigningMethod
	priv   crypto.Signer
}

func newIDPKey(t *testing.T, kid string, method jwt.SigningMethod) idpKey {
	t.Helper()
	var priv crypto.Signer
	var err error
	switch method {
	case jwt.SigningMethodRS256:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case jwt.SigningMethodES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	}
	if err != nil {
		t.Fatal(err)
	}
	return idpKey{kid: kid, method: method, priv: priv}
}

// sign mints a token for sub with this key; extra overrides claims.
func (k idpKey) sign(t testing.TB, sub string, extra jwt.MapClaims) string {
	t.Helper()
	c := jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix(), "iss": "https://idp.test", "aud": "flashsale"}
	for n, v := range extra {
		if v == nil {
			delete(c, n)
			continue
		}
		c[n] = v
	}
	tok := jwt.NewWithClaims(k.method, c)
	tok.Header["kid"] = k.kid
	s, err := tok.SignedString(k.priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// provider is an identity provider's JWKS endpoint whose key set the test
// changes, counting the requests it answers.
type provider struct {
	srv      *httptest.Server
	mu       sync.Mutex
	keys     []idpKey
	status   int // 0: 200
	requests atomic.Int64
}

func newProvider(t *testing.T, keys ...idpKey) *provider {
	t.Helper()
	p := &provider{keys: keys}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		p.requests.Add(1)
		p.mu.Lock()
		keys, status := p.keys, p.status
		p.mu.Unlock()
		if status != 0 {
			w.WriteHeader(status)
			return
		}
		var set jwkset.JWKSMarshal
		for _, k := range keys {
			j, err := jwkset.NewJWKFromKey(k.priv.Public(), jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: k.kid, ALG: jwkset.ALG(k.method.Alg())}})
			if err != nil {
				t.Errorf("JWK %s: %v", k.kid, err)
				return
			}
			set.Keys = append(set.Keys, j.Marshal())
		}
		_ = json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) set(status int, keys ...idpKey) {
	p.mu.Lock()
	p.status, p.keys = status, keys
	p.mu.Unlock()
}

func newTestJWKS(t *testing.T, url string, minRefresh time.Duration) *JWKS {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	k, err := NewJWKS(ctx, JWKSConfig{URL: url, MinRefresh: minRefresh, Timeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func wantRefused(t *testing.T, what string, err error) {
	t.Helper()
	if flashsale.ErrorCode(err) != flashsale.CodeUnauthenticated {
		t.Fatalf("%s: err = %v, want UNAUTHENTICATED", what, err)
	}
}

func wantUser(t *testing.T, what string, p flashsale.Principal, err error, user int64) {
	t.Helper()
	if err != nil || p.UserID != user {
		t.Fatalf("%s: got %+v, %v; want user %d", what, p, err, user)
	}
}

// TestJWKSRotation: tokens of the old key pass; once the provider rotates,
// the first token of a new key costs one fetch and every token of a kept
// key passes, tokens of the removed key are refused (cached or not), and a
// flood of unknown kids costs the provider nothing more.
func TestJWKSRotation(t *testing.T) {
	old := newIDPKey(t, "old", jwt.SigningMethodRS256)
	p := newProvider(t, old)
	jwks := newTestJWKS(t, p.srv.URL, time.Hour)
	v := NewVerifier(secret, WithJWKS(jwks), WithIssuer("https://idp.test"), WithAudience("flashsale"))
	c := NewCache(v, 1024)

	oldTok := old.sign(t, "11", nil)
	pr, err := c.Verify(oldTok)
	wantUser(t, "old key", pr, err, 11)
	if err := jwks.Ready(context.Background()); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	if got := p.requests.Load(); got != 1 {
		t.Fatalf("provider requests = %d, want 1 (the fetch at start)", got)
	}

	es, ed := newIDPKey(t, "new-es", jwt.SigningMethodES256), newIDPKey(t, "new-ed", jwt.SigningMethodEdDSA)
	p.set(0, es, ed)
	pr, err = c.Verify(es.sign(t, "12", nil))
	wantUser(t, "ES256 key after rotation", pr, err, 12)
	pr, err = c.Verify(ed.sign(t, "13", nil))
	wantUser(t, "EdDSA key after rotation", pr, err, 13)
	if got := p.requests.Load(); got != 2 {
		t.Fatalf("provider requests = %d, want 2 (one refresh for the new kid)", got)
	}
	_, err = c.Verify(oldTok)
	wantRefused(t, "cached token of the removed key", err)
	_, err = v.Verify(old.sign(t, "11", nil))
	wantRefused(t, "fresh token of the removed key", err)

	for i := range 50 {
		k := es
		k.kid = fmt.Sprintf("random-%d", i)
		_, err := c.Verify(k.sign(t, "14", nil))
		wantRefused(t, "unknown kid", err)
	}
	if got := p.requests.Load(); got != 2 {
		t.Fatalf("provider requests = %d after a flood of unknown kids, want still 2 (refreshes are rate-limited)", got)
	}
}

func TestJWKSRefused(t *testing.T) {
	key := newIDPKey(t, "k1", jwt.SigningMethodRS256)
	p := newProvider(t, key)
	jwks := newTestJWKS(t, p.srv.URL, time.Hour)
	strict := NewVerifier(secret, WithJWKS(jwks), WithIssuer("https://idp.test"), WithAudience("flashsale"))
	noSecret := NewVerifier("", WithJWKS(jwks))

	// Key confusion: the provider's public key (PEM and JWK bytes) used as
	// an HMAC secret, with the provider's kid.
	der, err := x509.MarshalPKIXPublicKey(key.priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	jwkJSON, err := json.Marshal(func() jwkset.JWKMarshal {
		j, _ := jwkset.NewJWKFromKey(key.priv.Public(), jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: "k1"}})
		return j.Marshal()
	}())
	if err != nil {
		t.Fatal(err)
	}
	hmacWith := func(k []byte) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "5", "exp": time.Now().Add(time.Hour).Unix(), "iss": "https://idp.test", "aud": "flashsale"})
		tok.Header["kid"] = "k1"
		s, err := tok.SignedString(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	none := func() string {
		tok := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "5", "exp": time.Now().Add(time.Hour).Unix(), "iss": "https://idp.test", "aud": "flashsale"})
		tok.Header["kid"] = "k1"
		s, err := tok.SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	stranger := newIDPKey(t, "k1", jwt.SigningMethodRS256) // same kid, another key

	if pr, err := strict.Verify(key.sign(t, "5", nil)); err != nil || pr.UserID != 5 {
		t.Fatalf("good token: %+v, %v", pr, err)
	}
	tests := []struct {
		name  string
		v     *Verifier
		token string
	}{
		{"wrong iss", strict, key.sign(t, "5", jwt.MapClaims{"iss": "https://evil.test"})},
		{"no iss", strict, key.sign(t, "5", jwt.MapClaims{"iss": nil})},
		{"wrong aud", strict, key.sign(t, "5", jwt.MapClaims{"aud": "another-app"})},
		{"no aud", strict, key.sign(t, "5", jwt.MapClaims{"aud": nil})},
		{"unknown kid", strict, func() string { k := key; k.kid = "k9"; return k.sign(t, "5", nil) }()},
		{"another key under a known kid", strict, stranger.sign(t, "5", nil)},
		{"expired", strict, key.sign(t, "5", jwt.MapClaims{"exp": time.Now().Add(-time.Hour).Unix()})},
		{"no exp", strict, key.sign(t, "5", jwt.MapClaims{"exp": nil})},
		{"alg none", strict, none},
		{"alg none, no secret", noSecret, none},
		{"HS256 keyed with the public key PEM", strict, hmacWith(pemKey)},
		{"HS256 keyed with the public key PEM, no secret", noSecret, hmacWith(pemKey)},
		{"HS256 keyed with the JWK", noSecret, hmacWith(jwkJSON)},
		{"HS256 keyed with the RSA modulus", noSecret, hmacWith(key.priv.Public().(*rsa.PublicKey).N.Bytes())},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.v.Verify(tt.token)
			wantRefused(t, tt.name, err)
		})
	}
	// The HS256 secret keeps working beside the JWKS, without iss or aud.
	tok, err := Mint(secret, 8, false, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if pr, err := strict.Verify(tok); err != nil || pr.UserID != 8 {
		t.Fatalf("HS256 token beside the JWKS: %+v, %v", pr, err)
	}
}

// TestJWKSUnreachableAtStart: a provider down at start is not an error;
// its tokens are refused and Ready reports the missing keys until a fetch
// succeeds.
func TestJWKSUnreachableAtStart(t *testing.T) {
	key := newIDPKey(t, "k1", jwt.SigningMethodES256)
	p := newProvider(t, key)
	p.set(http.StatusServiceUnavailable, key)
	jwks := newTestJWKS(t, p.srv.URL, 10*time.Millisecond)
	v := NewVerifier(secret, WithJWKS(jwks))
	if err := jwks.Ready(context.Background()); err == nil {
		t.Fatal("Ready with no keys loaded: nil error")
	}
	_, err := v.Verify(key.sign(t, "3", nil))
	wantRefused(t, "token while the provider is down", err)

	p.set(0, key)
	testenv.Eventually(t, "the keys to load after the provider came back", 30*time.Second, func() bool {
		return jwks.Ready(context.Background()) == nil
	})
	pr, err := v.Verify(key.sign(t, "3", nil))
	wantUser(t, "token once the keys loaded", pr, err, 3)
}

func TestNewJWKSBadURL(t *testing.T) {
	for _, u := range []string{"", "idp.test/jwks", "ftp://idp.test/jwks", "http://"} {
		if _, err := NewJWKS(context.Background(), JWKSConfig{URL: u}, nil); err == nil {
			t.Errorf("NewJWKS(%q): nil error", u)
		}
	}
}

func FuzzVerifyJWKS(f *testing.F) {
	key := idpKey{kid: "k1", method: jwt.SigningMethodES256}
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	key.priv = priv
	var set jwkset.JWKSMarshal
	j, err := jwkset.NewJWKFromKey(priv.Public(), jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: "k1", ALG: jwkset.AlgES256}})
	if err != nil {
		f.Fatal(err)
	}
	set.Keys = append(set.Keys, j.Marshal())
	body, _ := json.Marshal(set)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	jwks, err := NewJWKS(ctx, JWKSConfig{URL: srv.URL, MinRefresh: time.Hour}, nil)
	if err != nil {
		f.Fatal(err)
	}
	v := NewVerifier(secret, WithJWKS(jwks), WithAudience("flashsale"))
	f.Add(key.sign(f, "1", nil))
	f.Add("eyJhbGciOiJFUzI1NiIsImtpZCI6ImsxIn0.e30.x")
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Fuzz(func(t *testing.T, tok string) {
		p, err := v.Verify(tok)
		if err == nil && p.UserID <= 0 {
			t.Fatalf("accepted %q with user %d", tok, p.UserID)
		}
	})
}
