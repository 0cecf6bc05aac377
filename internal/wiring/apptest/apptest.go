// Package apptest starts a whole flashsale stack in-process for end-to-end
// tests (internal/wiring, browsertest, cmd/flashsale): every role on real Redis
// and PostgreSQL (internal/harness/testenv) and a kfake broker, with helpers to call
// the public API as a shopper or an operator.
package apptest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
)

// logTail bounds the log a stack keeps for a failing test.
const logTail = 64 << 10

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if over := len(w.b) - w.max; over > 0 {
		w.b = append(w.b[:0], w.b[over:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// Secret is the stacks' JWT secret.
const Secret = "apptest-jwt-secret-0123456789abcdef"

// Permissive lifts the per-address and per-user limits, the draw record's
// own included: every request of a test comes from one loopback address
// at a high rate (the defense tests cover the limits).
const Permissive = `{"rateLimit": {"perIp": {"rps": 100000, "burst": 100000}, "perUser": {"rps": 100000, "burst": 100000},
	"classes": {"draw": {"perIp": {"rps": 100000, "burst": 100000}}}},
	"pow": {"difficulty": 0}, "blocklist": {"cidrs": [], "users": []}}`

// Stack is a running in-process flashsale.
type Stack struct {
	T      testing.TB
	App    *wiring.App
	Config wiring.Config
	Client *http.Client
}

// Start starts every role on fresh test services (the package's TestMain
// must call testenv.Main) with permissive rate limits, and closes it when
// the test ends. mutate may change the configuration first.
func Start(t testing.TB, mutate ...func(*wiring.Config)) *Stack {
	t.Helper()
	cfg := wiring.Defaults()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	// One node's logical database, or the cluster of a cluster-mode run.
	rc := testenv.RedisConfig(t)
	cfg.RedisURL, cfg.RedisCluster = rc.URL, rc.Cluster
	cfg.DatabaseURL = testenv.DatabaseURL(t)
	cfg.KafkaBrokers = testenv.NewKafka(t).Brokers
	cfg.JWTSecret = Secret
	cfg.ExpiryInterval = 200 * time.Millisecond
	// The draw at the opening, as the tests written before the draw lead
	// expect (their sales open a moment after they start); a test of the
	// first wave sets DrawLead.
	cfg.DrawLead = 0
	// Position updates from the opening on, as those tests expect too;
	// the hold is waitroom's TestOpeningHold.
	cfg.OpeningHold = -1
	// Every connection of a test comes from one loopback address, many of
	// them at once; the cap on connections before their first request is
	// the security test's, which sets its own.
	cfg.MaxPendingConnsPerAddr = -1
	for _, m := range mutate {
		m(&cfg)
	}
	// The stack's warnings and errors are kept (the last logTail bytes)
	// and shown when the test fails: the cause behind a 503 or a stuck
	// step is in them, and a failure on CI is often seen once.
	// FLASHSALE_TEST_LOG also writes the whole log (from Info) to stderr.
	warnings := &tailBuffer{max: logTail}
	var out io.Writer = warnings
	level := slog.LevelWarn
	if os.Getenv("FLASHSALE_TEST_LOG") != "" {
		out, level = io.MultiWriter(warnings, os.Stderr), slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the stack's warnings and errors (last %d bytes):\n%s", logTail, warnings.String())
		}
	})
	a, err := wiring.Start(context.Background(), cfg, wiring.AllRoles, log)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if err := a.SetDefense(context.Background(), "test", []byte(Permissive)); err != nil {
		t.Fatalf("settings: %v", err)
	}
	return &Stack{T: t, App: a, Config: cfg, Client: &http.Client{Timeout: 10 * time.Second}}
}

// RiskToken mints a shopper's access token carrying the shop's risk
// score (the risk claim, 0 to 1).
func (s *Stack) RiskToken(user int64, risk float64) string {
	s.T.Helper()
	tok, err := auth.MintWith(Secret, user, auth.MintOptions{Risk: &risk}, time.Hour, time.Now())
	if err != nil {
		s.T.Fatal(err)
	}
	return tok
}

// Token mints an access token for user.
func (s *Stack) Token(user int64, operator bool) string {
	s.T.Helper()
	tok, err := auth.Mint(Secret, user, operator, time.Hour, time.Now())
	if err != nil {
		s.T.Fatal(err)
	}
	return tok
}

// Resp is an answer of the API.
type Resp struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    []byte
}

// Do calls the public address. body is nil, a string or []byte sent as is,
// or a value sent as JSON; hdr are header name/value pairs.
func (s *Stack) Do(method, path, bearer string, body any, hdr ...string) Resp {
	s.T.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			s.T.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.App.PublicURL+path, rd)
	if err != nil {
		s.T.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	r, err := s.Client.Do(req)
	if err != nil {
		s.T.Fatalf("%s %s: %v", method, path, err)
	}
	defer r.Body.Close()
	raw, _ := io.ReadAll(r.Body)
	out := Resp{Status: r.StatusCode, Header: r.Header, Raw: raw}
	_ = json.Unmarshal(raw, &out.Body)
	return out
}

// Want fails the test unless r has the status and, when code is not
// empty, the error code.
func (s *Stack) Want(r Resp, status int, code string) {
	s.T.Helper()
	if r.Status != status {
		s.T.Fatalf("status = %d, want %d; body %s", r.Status, status, r.Raw)
	}
	if code != "" && r.Body["error"] != code {
		s.T.Fatalf("error = %v, want %s; body %s", r.Body["error"], code, r.Raw)
	}
}
