package wiring

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"
)

var updateREADME = flag.Bool("update-readme", false, "rewrite README.md's table of settings from the spec (make readme-config)")

const (
	readmeBegin = "<!-- settings: generated from internal/wiring/settings.go by make readme-config -->\n"
	readmeEnd   = "<!-- settings: end -->\n"
)

// TestREADMESettings: the README's table of settings is the spec's
// (SettingsMarkdown); make readme-config rewrites it.
func TestREADMESettings(t *testing.T) {
	const path = "../../README.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, readmeBegin), strings.Index(s, readmeEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md has no generated table between %q and %q", readmeBegin, readmeEnd)
	}
	want := s[:i+len(readmeBegin)] + SettingsMarkdown() + s[j:]
	if *updateREADME {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if s != want {
		t.Errorf("README.md's table of settings is not the spec's: run make readme-config")
	}
}

// TestSettingsSpec checks the spec's rows: names and flags unique, a
// short meaning (the long story is in docs/CONFIGURATION.md), no flag for
// a secret, every default read back as itself, the removed variables
// gone, and every setting documented in docs/CONFIGURATION.md.
func TestSettingsSpec(t *testing.T) {
	doc, err := os.ReadFile("../../docs/CONFIGURATION.md")
	if err != nil {
		t.Fatal(err)
	}
	names, flags := map[string]bool{}, map[string]bool{}
	for _, s := range Settings() {
		if names[s.Name] {
			t.Errorf("%s: twice in the spec", s.Name)
		}
		names[s.Name] = true
		if s.Flag != "" && flags[s.Flag] {
			t.Errorf("%s: flag --%s is another setting's", s.Name, s.Flag)
		}
		flags[s.Flag] = true
		if !strings.HasPrefix(s.Name, "FLASHSALE_") || s.Meaning == "" || s.Roles == "" || s.parse == nil || s.show == nil {
			t.Errorf("%s: want a FLASHSALE_ name, a meaning, roles, a parser and a printer", s.Name)
		}
		if len(s.Meaning) > 90 {
			t.Errorf("%s: meaning of %d characters, want at most 90 (explain in docs/CONFIGURATION.md)", s.Name, len(s.Meaning))
		}
		if s.Secret && s.Flag != "" {
			t.Errorf("%s: a secret with a flag would show in a process list", s.Name)
		}
		if !bytes.Contains(doc, []byte("## `"+s.Name+"`")) {
			t.Errorf("%s: no section in docs/CONFIGURATION.md", s.Name)
		}
		def := Defaults()
		if v := s.show(&def); v != "" {
			got := Defaults()
			if err := got.FromEnv(func(k string) string { return map[string]string{s.Name: v}[k] }); err != nil || s.show(&got) != v {
				t.Errorf("%s=%q (its default): read back as %q, %v", s.Name, v, s.show(&got), err)
			}
		}
	}
	for _, r := range RemovedSettings() {
		if names[r] {
			t.Errorf("%s is removed but still in the spec", r)
		}
	}
}

// TestWriteSettingsRedacts: flashsale config shows that a secret is set,
// never its value, nor the password of a URL.
func TestWriteSettingsRedacts(t *testing.T) {
	env := map[string]string{
		"FLASHSALE_JWT_SECRET":     "jwt-secret-0123456789abcdef0123456789",
		"FLASHSALE_REDIS_PASSWORD": "redis-password-42",
		"FLASHSALE_DATABASE_URL":   "postgres://app:db-password-7@db:5432/flashsale",
		"FLASHSALE_HTTP_ADDR":      "0.0.0.0:8080",
		// A VAPID private key is a secret; its public key is not.
		"FLASHSALE_PUSH_VAPID_PRIVATE_KEY": "vapid-private-key-f00",
		"FLASHSALE_PUSH_VAPID_PUBLIC_KEY":  "vapid-public-key-b4r",
	}
	c := Defaults()
	if err := c.FromEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteSettings(&out, &c); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"jwt-secret", "redis-password", "db-password", "vapid-private"} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("output shows %q:\n%s", secret, out.String())
		}
	}
	for _, want := range []string{"0.0.0.0:8080", "<redacted>", "postgres://app:xxxxx@db:5432/flashsale", "vapid-public-key-b4r"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestFromEnvRemovedIgnored: the removed variables are no longer read, so
// a value once refused is ignored.
func TestFromEnvRemovedIgnored(t *testing.T) {
	c := Defaults()
	if err := c.FromEnv(func(k string) string {
		return map[string]string{"FLASHSALE_WAITING_PUSHES": "-7", "FLASHSALE_STATUS_EVERY": "soon"}[k]
	}); err != nil {
		t.Errorf("removed variables: %v, want them ignored", err)
	}
}
