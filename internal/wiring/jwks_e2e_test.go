package wiring_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/wiring"
)

// TestJWKSThroughHTTP: a stack configured with an identity provider's JWK
// Set takes the provider's tokens (operator and shopper) on the public API,
// refuses one for another audience with 401 UNAUTHENTICATED, keeps taking
// its own HS256 tokens, and is ready once the keys are loaded.
func TestJWKSThroughHTTP(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwk, err := jwkset.NewJWKFromKey(&key.PublicKey, jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: "idp-1", ALG: jwkset.AlgES256}})
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(jwkset.JWKSMarshal{Keys: []jwkset.JWKMarshal{jwk.Marshal()}})
	if err != nil {
		t.Fatal(err)
	}
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	t.Cleanup(idp.Close)
	s := startStack(t, func(c *wiring.Config) {
		c.JWTJWKSURL = idp.URL + "/.well-known/jwks.json"
		c.JWTIssuer = "https://idp.test"
		c.JWTAudience = "flashsale"
	})
	sign := func(sub string, aud string, operator bool) string {
		c := jwt.MapClaims{"sub": sub, "iss": "https://idp.test", "aud": aud, "exp": time.Now().Add(time.Hour).Unix()}
		if operator {
			c["role"] = "operator"
		}
		tok := jwt.NewWithClaims(jwt.SigningMethodES256, c)
		tok.Header["kid"] = "idp-1"
		out, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	r := s.Do("POST", "/api/admin/sales", sign("1", "flashsale", true), map[string]any{
		"name": "jwks", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339),
		"admissionRatePerSecond": 100, "allocation": "race", "items": []map[string]any{{"productId": 1, "quantity": 1, "priceCents": 100}},
	})
	s.Want(r, 201, "")
	saleID := int64(r.Body["id"].(float64))
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	s.Want(s.Do("POST", queue, sign("300", "flashsale", false), nil), 200, "")
	s.Want(s.Do("POST", queue, sign("301", "another-app", false), nil), 401, "UNAUTHENTICATED")
	s.Want(s.Do("POST", queue, s.Token(302, false), nil), 200, "")
	if got := readyz(t, s); got != 200 {
		t.Fatalf("/readyz = %d, want 200", got)
	}
}
