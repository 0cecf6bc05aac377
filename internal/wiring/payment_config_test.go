package wiring

import (
	"strings"
	"testing"
)

// TestPaymentSettings: FLASHSALE_PAYMENT_URL must be an absolute http(s)
// URL with {orderId}, and needs the payment secret, of at least 32
// bytes; each refusal names the variable.
// testSecret is a secret of the shortest accepted length.
const testSecret = "0123456789abcdef0123456789abcdef"

func TestPaymentSettings(t *testing.T) {
	for _, ok := range []string{"https://shop.example/pay/{orderId}", "http://127.0.0.1:3000/checkout?order={orderId}&x=1"} {
		c := Defaults()
		env := map[string]string{"FLASHSALE_PAYMENT_URL": ok, "FLASHSALE_PAYMENT_SECRET": "0123456789abcdef0123456789abcdef"}
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
	c.RedisURL, c.DatabaseURL, c.JWTSecret = "redis://r", "postgres://p", testSecret
	c.PaymentURL = "https://shop.example/pay/{orderId}"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "FLASHSALE_PAYMENT_SECRET") {
		t.Errorf("payment URL without secret: %v", err)
	}
	c.PaymentSecret = "too-short"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "FLASHSALE_PAYMENT_SECRET is 9 bytes: want at least 32") {
		t.Errorf("short payment secret: %v", err)
	}
	c.PaymentSecret = "0123456789abcdef0123456789abcdef"
	if err := c.Validate(); err != nil {
		t.Errorf("payment URL with secret: %v", err)
	}
}
