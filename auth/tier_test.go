package auth

import (
	"context"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TestTierClaim: a tier claim counts only from a trusted signer. Under a
// signer that is not trusted (the secret when only the identity
// provider is, a PEM key that names the provider's kid) the token is
// still accepted and the shopper has no tier.
func TestTierClaim(t *testing.T) {
	const secret = "tier-test-secret-0123456789abcdef"
	idp := newIDPKey(t, "idp-1", jwt.SigningMethodES256)
	pem := newIDPKey(t, "idp-1", jwt.SigningMethodES256) // a PEM key naming the provider's kid
	prov := newProvider(t, idp)
	jwks := newTestJWKS(t, prov.srv.URL, time.Minute)
	if err := jwks.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	hsTier := func(tier int) string {
		tok, err := MintTier(secret, 5, false, "", tier, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	none, onlySecret := TierSigners{}, TierSigners{Secret: true}
	onlyJWKS, onlyPEM := TierSigners{JWKS: true}, TierSigners{PublicKeys: true}
	for _, tt := range []struct {
		name    string
		trusted TierSigners
		token   string
		want    int
	}{
		{"secret, nothing trusted", none, hsTier(1), 0},
		{"secret, trusted", onlySecret, hsTier(2), 2},
		{"secret, only the provider trusted (forged)", onlyJWKS, hsTier(1), 0},
		{"provider, trusted", onlyJWKS, idp.sign(t, "5", jwt.MapClaims{"tier": 1}), 1},
		{"provider, only the secret trusted", onlySecret, idp.sign(t, "5", jwt.MapClaims{"tier": 1}), 0},
		{"PEM key with the provider's kid, provider trusted (forged)", onlyJWKS, pem.sign(t, "5", jwt.MapClaims{"tier": 1}), 0},
		{"PEM key, PEM trusted", onlyPEM, pem.sign(t, "5", jwt.MapClaims{"tier": 3}), 3},
		{"provider, only PEM trusted", onlyPEM, idp.sign(t, "5", jwt.MapClaims{"tier": 1}), 0},
		{"tier 0", onlySecret, hsTier(0), 0},
		{"tier as a string", onlyJWKS, idp.sign(t, "5", jwt.MapClaims{"tier": "1"}), 0},
		{"tier 10", onlyJWKS, idp.sign(t, "5", jwt.MapClaims{"tier": 10}), 0},
		{"tier 1.5", onlyJWKS, idp.sign(t, "5", jwt.MapClaims{"tier": 1.5}), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := NewVerifier(secret, WithJWKS(jwks), WithPublicKey(pem.priv.Public()), WithTierSigners(tt.trusted))
			p, err := v.Verify(tt.token)
			if err != nil {
				t.Fatalf("Verify: %v (a tier claim never refuses a token)", err)
			}
			if p.UserID != 5 || p.Tier != tt.want {
				t.Fatalf("principal %+v, want user 5 tier %d", p, tt.want)
			}
		})
	}
}

func TestParseTierSigners(t *testing.T) {
	got, err := ParseTierSigners([]string{"secret", "jwks"})
	if err != nil || got != (TierSigners{Secret: true, JWKS: true}) {
		t.Fatalf("ParseTierSigners = %+v, %v", got, err)
	}
	if got, err := ParseTierSigners([]string{"none"}); err != nil || got != (TierSigners{}) {
		t.Fatalf("none = %+v, %v", got, err)
	}
	if _, err := ParseTierSigners([]string{"hs256"}); err == nil {
		t.Fatal("an unknown signer parsed")
	}
}
