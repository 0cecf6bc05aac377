package wiring

import (
	"strings"
	"testing"

	"github.com/flashsale/flashsale/push"
)

// TestPushSettings: the VAPID pair is read from the environment and
// checked at start: both keys or neither, the public key the private
// key's, a contact subject.
func TestPushSettings(t *testing.T) {
	pub, priv, err := push.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	otherPub, _, _ := push.GenerateKeys()
	env := map[string]string{
		"FLASHSALE_PUSH_VAPID_PUBLIC_KEY":  pub,
		"FLASHSALE_PUSH_VAPID_PRIVATE_KEY": priv,
		"FLASHSALE_PUSH_SUBJECT":           "mailto:ops@shop.example",
		"FLASHSALE_PUSH_INSECURE_HOSTS":    "127.0.0.1,push.test",
	}
	c := Defaults()
	if err := c.FromEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if c.PushPublicKey != pub || c.PushPrivateKey != priv || c.PushSubject != env["FLASHSALE_PUSH_SUBJECT"] || c.PushInsecureHosts != env["FLASHSALE_PUSH_INSECURE_HOSTS"] {
		t.Errorf("push settings %+v", c)
	}
	c.RedisURL, c.DatabaseURL, c.JWTSecret = "redis://r", "postgres://p", testSecret
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	for _, tt := range []struct{ name, pub, priv, subject, want string }{
		{"public alone", pub, "", "mailto:a@b.example", "set together"},
		{"private alone", "", priv, "mailto:a@b.example", "set together"},
		{"not the pair", otherPub, priv, "mailto:a@b.example", "FLASHSALE_PUSH_VAPID_PUBLIC_KEY"},
		{"no subject", pub, priv, "", "FLASHSALE_PUSH_SUBJECT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Defaults()
			c.RedisURL, c.DatabaseURL, c.JWTSecret = "redis://r", "postgres://p", testSecret
			c.PushPublicKey, c.PushPrivateKey, c.PushSubject = tt.pub, tt.priv, tt.subject
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want an error with %q", err, tt.want)
			}
		})
	}
}
