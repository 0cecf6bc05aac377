package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// mainArgsEnv makes the test binary run the command line it holds, as the
// flashsale binary would, instead of the tests: tests start subcommands as
// real processes they can kill.
const mainArgsEnv = "FLASHSALE_TEST_MAIN_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(mainArgsEnv); args != "" {
		os.Exit(run(strings.Fields(args), os.Stdout, os.Stderr))
	}
	testenv.Main(m)
}

func runCmd(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestToken(t *testing.T) {
	code, out, errOut := runCmd(t, map[string]string{"FLASHSALE_JWT_SECRET": "s3cret"}, "token", "--user", "42", "--role", "operator", "--ttl", "2h")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	p, err := auth.NewVerifier("s3cret").Verify(strings.TrimSpace(out))
	if err != nil || p.UserID != 42 || !p.Operator {
		t.Fatalf("token %q verifies as %+v, %v", out, p, err)
	}
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"no user", []string{"token"}, 1},
		{"bad user", []string{"token", "--user", "bob"}, 1},
		{"bad role", []string{"token", "--user", "1", "--role", "admin"}, 1},
		{"unknown flag", []string{"token", "--nope"}, 2},
		{"unknown command", []string{"frobnicate"}, 2},
		{"no command", nil, 2},
		{"help", []string{"help"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code, _, errOut := runCmd(t, nil, tt.args...); code != tt.want {
				t.Fatalf("exit %d, want %d: %s", code, tt.want, errOut)
			}
		})
	}
}

func TestMigrateAndVerifyDraw(t *testing.T) {
	s := apptest.Start(t)
	env := map[string]string{"FLASHSALE_DATABASE_URL": s.Config.DatabaseURL, "FLASHSALE_REDIS_URL": s.Config.RedisURL}
	if code, out, errOut := runCmd(t, env, "migrate"); code != 0 || !strings.Contains(out, "schema at version") {
		t.Fatalf("migrate (again, on a current schema): exit %d, %s %s", code, out, errOut)
	}
	ctx := context.Background()
	future, err := s.App.CreateSale(ctx, flashsale.Sale{Name: "later", StartsAt: time.Now().Add(time.Hour), AdmissionRatePerSecond: 10, Allocation: flashsale.AllocationRace,
		Items: []flashsale.Item{{ProductID: 1, Quantity: 5, PriceCents: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd(t, env, "verify-draw", "--sale", itoa(future.ID))
	if code != 0 || !strings.Contains(out, "secret until then") || strings.Contains(out, future.SeedHex()) {
		t.Fatalf("verify-draw before opening must not reveal the seed: exit %d, %s %s", code, out, errOut)
	}
	open, err := s.App.CreateSale(ctx, flashsale.Sale{Name: "now", StartsAt: time.Now().Add(-time.Second), AdmissionRatePerSecond: 1000, Allocation: flashsale.AllocationRace,
		Items: []flashsale.Item{{ProductID: 1, Quantity: 5, PriceCents: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCmd(t, env, "verify-draw", "--sale", itoa(open.ID))
	if code != 0 || !strings.Contains(out, "OK:") || !strings.Contains(out, open.SeedHex()) {
		t.Fatalf("verify-draw of an open sale: exit %d, %s %s", code, out, errOut)
	}
	if code, _, _ := runCmd(t, env, "verify-draw", "--sale", "987654"); code != 1 {
		t.Fatalf("verify-draw of an unknown sale: exit %d, want 1", code)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestShortSecretRefused: every role command refuses FLASHSALE_JWT_SECRET=k
// at start, naming the variable, before it connects to anything (the
// dependencies' addresses here answer nobody).
func TestShortSecretRefused(t *testing.T) {
	env := map[string]string{
		"FLASHSALE_JWT_SECRET":    "k",
		"FLASHSALE_REDIS_URL":     "redis://127.0.0.1:1/0",
		"FLASHSALE_DATABASE_URL":  "postgres://x@127.0.0.1:1/x",
		"FLASHSALE_KAFKA_BROKERS": "127.0.0.1:1",
	}
	for _, role := range []string{"gateway", "writer", "expiry"} {
		t.Run(role, func(t *testing.T) {
			code, _, errOut := runCmd(t, env, role, "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0")
			if code == 0 || !strings.Contains(errOut, "FLASHSALE_JWT_SECRET is 1 bytes: want at least 32") {
				t.Fatalf("%s with FLASHSALE_JWT_SECRET=k: exit %d, stderr %q; want a refusal naming the variable", role, code, errOut)
			}
		})
	}
}

// TestConfig: flashsale config prints the effective settings with the
// secrets and URL passwords redacted, and fails when a serving role would
// not start with them.
func TestConfig(t *testing.T) {
	env := map[string]string{
		"FLASHSALE_DATABASE_URL":   "postgres://app:db-password-7@db:5432/flashsale",
		"FLASHSALE_REDIS_URL":      "redis://127.0.0.1:6379/0",
		"FLASHSALE_KAFKA_BROKERS":  "kafka:9092",
		"FLASHSALE_JWT_SECRET":     "jwt-secret-0123456789abcdef0123456789",
		"FLASHSALE_REDIS_PASSWORD": "redis-password-42",
	}
	code, out, errOut := runCmd(t, env, "config", "--admission-ttl", "90s")
	if code != 0 {
		t.Fatalf("config: exit %d, stderr %s", code, errOut)
	}
	for _, want := range []string{"FLASHSALE_ADMISSION_TTL", "1m30s", "postgres://app:xxxxx@db:5432/flashsale", "<redacted>"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, secret := range []string{"jwt-secret", "redis-password", "db-password"} {
		if strings.Contains(out+errOut, secret) {
			t.Errorf("output shows %q:\n%s", secret, out)
		}
	}
	t.Setenv("FLASHSALE_JWT_SECRET", "short")
	if code, _, errOut := runCmd(t, nil, "config"); code != 1 || !strings.Contains(errOut, "FLASHSALE_JWT_SECRET") || strings.Contains(errOut, "short") {
		t.Errorf("config with a short secret: exit %d, stderr %q; want 1 naming the variable, not its value", code, errOut)
	}
}
