package events

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

var webhookSecret = []byte("0123456789abcdef-webhook-0123456789abcdef")

// receiver is a shop's webhook endpoint: it checks every request's
// signature and headers, answers what fail says, and records what it
// accepted.
type receiver struct {
	t    testing.TB
	fail func(eventID int64, n int) int // status to answer the n-th request (0: 200)

	mu       sync.Mutex
	requests int
	tries    map[int64]int
	accepted []Event
	bodies   [][]byte // of accepted, in the same order
	hang     time.Duration
}

func newReceiver(t testing.TB, fail func(eventID int64, n int) int) (*receiver, *httptest.Server) {
	rc := &receiver{t: t, fail: fail, tries: map[int64]int{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	return rc, srv
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		rc.t.Errorf("receiver: %v", err)
		return
	}
	if _, err := Verify(webhookSecret, r.Header.Get(SignatureHeader), body, time.Now(), 5*time.Minute); err != nil {
		rc.t.Errorf("receiver: signature %q: %v", r.Header.Get(SignatureHeader), err)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil {
		rc.t.Errorf("receiver: body %s: %v", body, err)
	}
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" ||
		r.Header.Get(WebhookEventIDHeader) != strconv.FormatInt(ev.EventID, 10) || r.Header.Get(WebhookEventTypeHeader) != string(ev.Type) {
		rc.t.Errorf("receiver: %s with headers %v for event %+v", r.Method, r.Header, ev)
	}
	rc.mu.Lock()
	rc.requests++
	n := rc.requests
	rc.tries[ev.EventID]++
	status := 0
	if rc.fail != nil {
		status = rc.fail(ev.EventID, n)
	}
	hang := rc.hang
	if status == 0 {
		rc.accepted = append(rc.accepted, ev)
		rc.bodies = append(rc.bodies, body)
	}
	rc.mu.Unlock()
	if status == -1 {
		time.Sleep(hang) // longer than the deliverer's timeout
		return
	}
	if status != 0 {
		w.WriteHeader(status)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) snapshot() ([]Event, map[int64]int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	tries := make(map[int64]int, len(rc.tries))
	for k, v := range rc.tries {
		tries[k] = v
	}
	return append([]Event(nil), rc.accepted...), tries
}

func newTestDeliverer(t testing.TB, pool *pgxpool.Pool, url string, cfg WebhookConfig) (*Deliverer, *prometheus.Registry) {
	t.Helper()
	cfg.URL, cfg.Secret = url, webhookSecret
	if cfg.Backoff == 0 {
		cfg.Backoff, cfg.MaxBackoff = time.Millisecond, 4*time.Millisecond
	}
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Millisecond
	}
	reg := prometheus.NewRegistry()
	d, err := NewDeliverer(cfg, pool, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})), reg)
	if err != nil {
		t.Fatal(err)
	}
	return d, reg
}

func runDeliverer(t testing.TB, d *Deliverer) {
	t.Helper()
	runUntilCleanup(t, "Deliverer.Run", d.Run)
}

// runUntilCleanup runs run on a goroutine until the test ends, and checks
// that it then returned nil.
func runUntilCleanup(t testing.TB, name string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
}

func undelivered(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	return countRows(t, pool, `SELECT count(*) FROM order_events WHERE webhook_done_at IS NULL`)
}

// countRows is the count a count(*) query returns.
func countRows(t testing.TB, pool *pgxpool.Pool, query string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkOrderKept checks that each order's accepted events came in id
// order and that no event was accepted twice.
func checkOrderKept(t testing.TB, accepted []Event) {
	t.Helper()
	last := map[string]int64{}
	seen := map[int64]bool{}
	for _, ev := range accepted {
		if seen[ev.EventID] {
			t.Errorf("event %d accepted twice", ev.EventID)
		}
		seen[ev.EventID] = true
		if ev.EventID <= last[ev.OrderID] {
			t.Errorf("order %s: event %d accepted after %d", ev.OrderID, ev.EventID, last[ev.OrderID])
		}
		last[ev.OrderID] = ev.EventID
	}
}

func TestWebhookFailsThenRecovers(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	orders := appendEvents(t, pool, 12)
	const failFirst = 15
	rc, srv := newReceiver(t, func(_ int64, n int) int {
		if n <= failFirst {
			return []int{500, 503, 404, 302}[n%4]
		}
		return 0
	})
	d, reg := newTestDeliverer(t, pool, srv.URL, WebhookConfig{MaxAttempts: 10, Parallel: 4})
	runDeliverer(t, d)
	waitFor(t, "every event delivered", func() bool { return undelivered(t, pool) == 0 })
	accepted, tries := rc.snapshot()
	if got, want := len(accepted), len(orders)*len(lifecycle); got != want {
		t.Errorf("%d events accepted, want %d", got, want)
	}
	checkOrderKept(t, accepted)
	retried := 0
	for _, n := range tries {
		if n > 1 {
			retried++
		}
	}
	if retried == 0 {
		t.Error("no event was retried: the receiver's failures were not seen")
	}
	var dead int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_dead_letters`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("%d dead letters, want 0", dead)
	}
	if got := metricValue(t, reg, "flashsale_events_webhook_deliveries_total", "result", "refused"); got != failFirst {
		t.Errorf("refused deliveries = %v, want %d", got, failFirst)
	}
	if got := metricValue(t, reg, "flashsale_events_webhook_deliveries_total", "result", "delivered"); got != float64(len(accepted)) {
		t.Errorf("delivered = %v, want %d", got, len(accepted))
	}
	waitFor(t, "the pending gauge at 0", func() bool { return gauge(t, d.pending) == 0 })
}

func TestWebhookDeadLettersAndGoesOn(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	orders := appendEvents(t, pool, 3)
	var poison int64
	if err := pool.QueryRow(context.Background(), `SELECT min(id) FROM order_events WHERE order_id = $1`, orders[1]).Scan(&poison); err != nil {
		t.Fatal(err)
	}
	rc, srv := newReceiver(t, func(id int64, _ int) int {
		if id == poison {
			return http.StatusInternalServerError
		}
		return 0
	})
	const maxAttempts = 4
	d, reg := newTestDeliverer(t, pool, srv.URL, WebhookConfig{MaxAttempts: maxAttempts})
	runDeliverer(t, d)
	waitFor(t, "every event delivered or dead", func() bool { return undelivered(t, pool) == 0 })
	accepted, tries := rc.snapshot()
	if tries[poison] != maxAttempts {
		t.Errorf("the refused event was tried %d times, want %d", tries[poison], maxAttempts)
	}
	if got, want := len(accepted), len(orders)*len(lifecycle)-1; got != want {
		t.Errorf("%d events accepted, want %d (all but the dead one)", got, want)
	}
	checkOrderKept(t, accepted)
	var later bool
	for _, ev := range accepted {
		later = later || (ev.OrderID == orders[1] && ev.EventID > poison)
	}
	if !later {
		t.Error("the dead event's order got none of its later events")
	}
	var attempts, status int
	var lastErr string
	if err := pool.QueryRow(context.Background(), `SELECT attempts, last_status, last_error FROM webhook_dead_letters WHERE event_id = $1`, poison).
		Scan(&attempts, &status, &lastErr); err != nil {
		t.Fatalf("dead letter of event %d: %v", poison, err)
	}
	if attempts != maxAttempts || status != 500 || !strings.Contains(lastErr, "500") {
		t.Errorf("dead letter: %d attempts, status %d, error %q; want %d, 500, the status", attempts, status, lastErr, maxAttempts)
	}
	if got := metricValue(t, reg, "flashsale_events_webhook_dead_letters_total", "", ""); got != 1 {
		t.Errorf("dead letters metric = %v, want 1", got)
	}
	var left int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_attempts`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d attempt rows left, want 0", left)
	}
}

func TestWebhookTimeoutIsAFailure(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	appendEvents(t, pool, 1)
	rc, srv := newReceiver(t, func(_ int64, n int) int {
		if n == 1 {
			return -1
		}
		return 0
	})
	rc.hang = 2 * time.Second
	d, reg := newTestDeliverer(t, pool, srv.URL, WebhookConfig{Timeout: 100 * time.Millisecond})
	runDeliverer(t, d)
	waitFor(t, "every event delivered", func() bool { return undelivered(t, pool) == 0 })
	if got := metricValue(t, reg, "flashsale_events_webhook_deliveries_total", "result", "failed"); got != 1 {
		t.Errorf("failed deliveries = %v, want 1 (the timeout)", got)
	}
	accepted, _ := rc.snapshot()
	if len(accepted) != len(lifecycle) {
		t.Errorf("%d accepted, want %d", len(accepted), len(lifecycle))
	}
}

// Two deliverers at once never send one event twice at the same time:
// each event is accepted once.
func TestWebhookDeliverersOneAtATime(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	appendEvents(t, pool, 20)
	rc, srv := newReceiver(t, nil)
	for range 3 {
		d, _ := newTestDeliverer(t, pool, srv.URL, WebhookConfig{})
		runDeliverer(t, d)
	}
	waitFor(t, "every event delivered", func() bool { return undelivered(t, pool) == 0 })
	accepted, tries := rc.snapshot()
	checkOrderKept(t, accepted)
	for id, n := range tries {
		if n != 1 {
			t.Errorf("event %d sent %d times, want 1", id, n)
		}
	}
}

func TestCheckWebhook(t *testing.T) {
	cases := []struct {
		name, url, secret string
		attempts          int
		want              string // "" when fine
	}{
		{"off", "", "", 0, ""},
		{"good", "https://shop.example/hooks/flashsale", string(webhookSecret), 10, ""},
		{"no secret", "https://shop.example/h", "", 10, "FLASHSALE_WEBHOOK_SECRET is required"},
		{"short secret", "https://shop.example/h", "short", 10, "at least 32"},
		{"31 bytes", "https://shop.example/h", strings.Repeat("k", 31), 10, "FLASHSALE_WEBHOOK_SECRET is 31 bytes"},
		{"32 bytes", "https://shop.example/h", strings.Repeat("k", 32), 10, ""},
		{"not a URL", "shop.example/h", string(webhookSecret), 10, "FLASHSALE_WEBHOOK_URL"},
		{"ftp", "ftp://shop.example/h", string(webhookSecret), 10, "FLASHSALE_WEBHOOK_URL"},
		{"no host", "https:///h", string(webhookSecret), 10, "FLASHSALE_WEBHOOK_URL"},
		{"credentials", "https://u:p@shop.example/h", string(webhookSecret), 10, "credentials"},
		{"negative attempts", "https://shop.example/h", string(webhookSecret), -1, "FLASHSALE_WEBHOOK_MAX_ATTEMPTS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckWebhook(c.url, []byte(c.secret), c.attempts)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("CheckWebhook = %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("CheckWebhook = %v, want an error naming %q", err, c.want)
			}
			if c.url != "" && c.want != "" {
				if _, err := NewDeliverer(WebhookConfig{URL: c.url, Secret: []byte(c.secret), MaxAttempts: c.attempts}, nil, nil, nil); err == nil {
					t.Error("NewDeliverer accepted the bad settings")
				}
			}
		})
	}
}

func TestBackoffDoublesToItsCap(t *testing.T) {
	d := &Deliverer{cfg: WebhookConfig{Backoff: time.Second, MaxBackoff: 5 * time.Minute}}
	for n, full := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 9: 256 * time.Second, 10: 5 * time.Minute, 30: 5 * time.Minute} {
		for range 20 {
			if got := d.backoff(n); got < full/2 || got > full {
				t.Errorf("backoff(%d) = %v, want within [%v, %v]", n, got, full/2, full)
			}
		}
	}
}

// metricValue is the counter value of name (with label=value when label
// is set) in reg.
func metricValue(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s{%s=%q} not found", name, label, value)
	return 0
}
