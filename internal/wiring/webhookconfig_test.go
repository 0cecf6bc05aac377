package wiring

import (
	"context"
	"log/slog"
	"strings"
	"testing"
)

func TestWebhookSettings(t *testing.T) {
	env := map[string]string{
		"FLASHSALE_WEBHOOK_URL":          "https://shop.example/hooks/flashsale",
		"FLASHSALE_WEBHOOK_SECRET":       "0123456789abcdef0123456789abcdef",
		"FLASHSALE_WEBHOOK_MAX_ATTEMPTS": "4",
	}
	c := Defaults()
	if c.WebhookMaxAttempts != 10 {
		t.Errorf("default max attempts %d, want 10", c.WebhookMaxAttempts)
	}
	if err := c.FromEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if c.WebhookURL != env["FLASHSALE_WEBHOOK_URL"] || c.WebhookSecret != env["FLASHSALE_WEBHOOK_SECRET"] || c.WebhookMaxAttempts != 4 {
		t.Errorf("webhook settings %q %q %d", c.WebhookURL, c.WebhookSecret, c.WebhookMaxAttempts)
	}
	c.RedisURL, c.DatabaseURL, c.JWTSecret = "redis://r", "postgres://p", testSecret
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	for _, bad := range []string{"0", "-3", "ten"} {
		c := Defaults()
		err := c.FromEnv(func(k string) string {
			if k == "FLASHSALE_WEBHOOK_MAX_ATTEMPTS" {
				return bad
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), "FLASHSALE_WEBHOOK_MAX_ATTEMPTS") {
			t.Errorf("FLASHSALE_WEBHOOK_MAX_ATTEMPTS=%q: err %v, want one naming it", bad, err)
		}
	}

	tests := []struct {
		name, url, secret, want string
	}{
		{"URL without secret", "https://shop.example/h", "", "FLASHSALE_WEBHOOK_SECRET is required"},
		{"short secret", "https://shop.example/h", "abc", "FLASHSALE_WEBHOOK_SECRET"},
		{"not http", "mailto:ops@shop.example", "0123456789abcdef0123456789abcdef", "FLASHSALE_WEBHOOK_URL"},
		{"relative", "/hooks", "0123456789abcdef0123456789abcdef", "FLASHSALE_WEBHOOK_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Defaults()
			c.RedisURL, c.DatabaseURL, c.JWTSecret = "redis://r", "postgres://p", testSecret
			c.WebhookURL, c.WebhookSecret = tt.url, tt.secret
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want an error with %q", err, tt.want)
			}
			// The expiry role does not start on them.
			a, err := Start(context.Background(), c, Roles{Expiry: true}, slog.New(slog.DiscardHandler))
			if err == nil {
				_ = a.Close(context.Background())
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start = %v, want an error with %q", err, tt.want)
			}
		})
	}
}
