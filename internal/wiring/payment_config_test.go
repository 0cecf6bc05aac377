package wiring

import (
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/events"
)

// TestPaymentSettings: FLASHSALE_PAYMENT_URL must be an absolute http(s)
// URL with {orderId}, and needs the payment secret, of at least 16
// characters; each refusal names the variable.
func TestPaymentSettings(t *testing.T) {
	for _, ok := range []string{"https://shop.example/pay/{orderId}", "http://127.0.0.1:3000/checkout?order={orderId}&x=1"} {
		c := Defaults()
		env := map[string]string{"FLASHSALE_PAYMENT_URL": ok, "FLASHSALE_PAYMENT_SECRET": "0123456789abcdef"}
		if err := c.FromEnv(func(k string) string { return env[k] }); err != nil || c.PaymentURL != ok || c.PaymentSecret != env["FLASHSALE_PAYMENT_SECRET"] {
			t.Errorf("%q: %v, config %q %q", ok, err, c.PaymentURL, c.PaymentSecret)
		}
	}
	for _, bad := range []string{"/pay/{orderId}", "shop.example/pay/{orderId}", "ftp://shop.example/{orderId}",
		"https://shop.example/pay", "https://{orderId}:x", "https:///pay/{orderId}"} {
		c := Defaults()
		err := c.FromEnv(func(k string) string {
			if k == "FLASHSALE_PAYMENT_URL" {
				return bad
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), "FLASHSALE_PAYMENT_URL") {
			t.Errorf("%q: err %v, want one naming FLASHSALE_PAYMENT_URL", bad, err)
		}
	}
	c := Defaults()
	c.RedisURL, c.DatabaseURL, c.JWTSecret = "redis://r", "postgres://p", "s"
	c.PaymentURL = "https://shop.example/pay/{orderId}"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "FLASHSALE_PAYMENT_SECRET") {
		t.Errorf("payment URL without secret: %v", err)
	}
	c.PaymentSecret = "too-short"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "FLASHSALE_PAYMENT_SECRET: want at least 16") {
		t.Errorf("short payment secret: %v", err)
	}
	c.PaymentSecret = "0123456789abcdef"
	if err := c.Validate(); err != nil {
		t.Errorf("payment URL with secret: %v", err)
	}
}

// TestVerifyPayment: the signature check's answers, and one canonical
// signature for every header that passes for the same request.
func TestVerifyPayment(t *testing.T) {
	p := shopPayments{secret: []byte("k")}
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"paymentId":"p","amountCents":1}`)
	sig := events.Sign(p.secret, now, body)
	canon, at, err := p.VerifyPayment(sig, body, now.Add(time.Minute))
	if err != nil || !at.Equal(now) || canon != sig {
		t.Fatalf("good signature: %q %v %v", canon, at, err)
	}
	// Spaced, upper-case hex, with an old secret's v1 beside it.
	v1 := strings.TrimPrefix(sig, "t=1800000000,v1=")
	other := strings.TrimPrefix(events.Sign([]byte("old"), now, body), "t=1800000000,v1=")
	for _, h := range []string{"t=1800000000, v1=" + strings.ToUpper(v1), "v1=" + other + ",t=1800000000,v1=" + v1} {
		if c, _, err := p.VerifyPayment(h, body, now); err != nil || c != canon {
			t.Errorf("%q: %q %v, want %q", h, c, err, canon)
		}
	}
	for name, tc := range map[string]struct {
		header string
		now    time.Time
		code   flashsale.Code
	}{
		"none":       {"", now, flashsale.CodeBadSignature},
		"malformed":  {"t=1800000000", now, flashsale.CodeBadSignature},
		"wrong":      {events.Sign([]byte("guess"), now, body), now, flashsale.CodeBadSignature},
		"late":       {sig, now.Add(5*time.Minute + time.Second), flashsale.CodeStaleSignature},
		"early":      {sig, now.Add(-5*time.Minute - time.Second), flashsale.CodeStaleSignature},
		"edge late":  {sig, now.Add(5 * time.Minute), ""},
		"edge early": {sig, now.Add(-5 * time.Minute), ""},
	} {
		_, _, err := p.VerifyPayment(tc.header, body, tc.now)
		if got := flashsale.ErrorCode(err); got != tc.code {
			t.Errorf("%s: code %q (%v), want %q", name, got, err, tc.code)
		}
	}
}
