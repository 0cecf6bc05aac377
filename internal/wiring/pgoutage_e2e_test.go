package wiring_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// ownPostgres starts a PostgreSQL cluster of the test's own (the shared
// one of internal/harness/testenv cannot be stopped) with the schema
// applied; its commits wait for the WAL, so a crash keeps every commit
// it acknowledged.
func ownPostgres(t *testing.T) (*localsvc.Postgres, string) {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	pg, err := localsvc.StartPostgres(ctx, localsvc.PostgresOptions{Dir: dir, Fast: true, SyncCommit: true})
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	pool, err := postgres.Open(ctx, postgres.Config{URL: pg.URL, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pg, dir
}

// crashPostgres stops the cluster in dir as `pg_ctl stop -m immediate`
// does (SIGQUIT to the postmaster: no checkpoint, every backend ends at
// once) and waits until it is gone.
func crashPostgres(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, fmt.Sprintf("postmaster %d to end after SIGQUIT", pid), 30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
}

// noInternal fails unless r is not a 5xx, or a 503 UNAVAILABLE with a
// Retry-After header.
func noInternal(t *testing.T, what string, r apptest.Resp) {
	t.Helper()
	if r.Status < 500 {
		return
	}
	if r.Status != http.StatusServiceUnavailable || r.Body["error"] != "UNAVAILABLE" || r.Header.Get("Retry-After") == "" {
		t.Errorf("%s: status %d, Retry-After %q, body %s; want no 5xx but 503 UNAVAILABLE with Retry-After",
			what, r.Status, r.Header.Get("Retry-After"), r.Raw)
	}
}

func readyz(t *testing.T, s *stack) int {
	t.Helper()
	r, err := s.Client.Get(s.App.AdminURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	return r.StatusCode
}

// TestPostgresOutage stops PostgreSQL (immediate mode) in the middle of a
// sale: orders held in Redis are answered from Redis, pay and cancel
// answer 503 with Retry-After, purchases keep working, no route answers
// 500, /readyz is 503 until the database is back; then everything recorded
// meanwhile becomes payable.
func TestPostgresOutage(t *testing.T) {
	pg, dir := ownPostgres(t)
	const window = 10 * time.Minute
	s := startStack(t, func(c *wiring.Config) { c.DatabaseURL = pg.URL; c.PaymentWindow = window })
	saleID, items := s.createSale(5, 5)
	opTok := s.Token(1, true)
	salePath := fmt.Sprintf("/api/flash-sales/sales/%d", saleID)
	s.Want(s.Do("GET", "/api/flash-sales/sales", "", nil), 200, "") // the list the page may be served while the database is down

	// An order stored before the outage, and admissions for later.
	at100 := s.admit(100, saleID)
	r := s.purchase(100, items[0], at100)
	s.Want(r, 202, "")
	stored := r.Body["orderId"].(string)
	s.waitPayable(100, stored)
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+stored+"/pay", s.Token(100, false), nil), 200, "")
	at101, at102 := s.admit(101, saleID), s.admit(102, saleID)

	crashPostgres(t, dir)

	// A purchase needs only Redis and Kafka.
	r = s.purchase(101, items[1], at101)
	s.Want(r, 202, "")
	held := r.Body["orderId"].(string)
	u101 := s.Token(101, false)

	for _, c := range []struct {
		name, path string
		user       int64
		order      string
		item       int64
		status     string
	}{
		{"accepted during the outage", "/api/flash-sales/orders/" + held, 101, held, items[1], "PENDING"},
		{"the caller's order in the sale", salePath + "/order", 101, held, items[1], "PENDING"},
		{"paid before the outage", "/api/flash-sales/orders/" + stored, 100, stored, items[0], "PAID"},
		{"the paid order in the sale", salePath + "/order", 100, stored, items[0], "PAID"},
	} {
		r := s.Do("GET", c.path, s.Token(c.user, false), nil)
		if r.Status != 200 {
			t.Fatalf("%s: GET %s = %d %s, want 200 from Redis", c.name, c.path, r.Status, r.Raw)
		}
		b := r.Body
		if b["orderId"] != c.order || b["status"] != c.status || b["payable"] != false ||
			b["itemId"] != float64(c.item) || b["saleId"] != float64(saleID) || b["priceCents"] != float64(1999) {
			t.Fatalf("%s: body %s, want %s, payable false, item %d, sale %d, 1999 cents", c.name, r.Raw, c.status, c.item, saleID)
		}
		created, err1 := time.Parse(time.RFC3339, b["createdAt"].(string))
		expires, err2 := time.Parse(time.RFC3339, b["expiresAt"].(string))
		if err1 != nil || err2 != nil || !expires.Equal(created.Add(window)) {
			t.Fatalf("%s: createdAt %v, expiresAt %v: want expiresAt = createdAt + %v", c.name, b["createdAt"], b["expiresAt"], window)
		}
	}
	if r := s.Do("GET", salePath+"/order", s.Token(102, false), nil); r.Status != 404 {
		t.Fatalf("GET order in sale of a user holding none = %d %s, want 404 (Redis holds no buyer record)", r.Status, r.Raw)
	}
	for _, p := range []string{"/pay", "/cancel"} {
		r := s.Do("POST", "/api/flash-sales/orders/"+held+p, u101, nil)
		s.Want(r, 503, "UNAVAILABLE")
		noInternal(t, "POST "+p, r)
	}
	if got := readyz(t, s); got != 503 {
		t.Fatalf("/readyz = %d while PostgreSQL is down, want 503", got)
	}

	// Every other route: no 500 while the database is down.
	u102 := s.Token(102, false)
	for _, c := range []struct {
		method, path, tok string
		body              any
	}{
		{"GET", "/api/flash-sales/orders/" + "00000000-0000-4000-8000-000000000001", u101, nil},
		{"POST", "/api/flash-sales/orders/" + stored + "/pay", s.Token(100, false), nil},
		{"GET", salePath, "", nil},
		{"GET", "/api/flash-sales/sales", "", nil},
		{"GET", salePath + "/queue", u102, nil},
		{"POST", salePath + "/queue", s.Token(103, false), nil},
		{"GET", "/api/admin/sales", opTok, nil},
		{"GET", fmt.Sprintf("/api/admin/sales/%d", saleID), opTok, nil},
		{"PATCH", fmt.Sprintf("/api/admin/sales/%d", saleID), opTok, map[string]any{"admissionRatePerSecond": 500}},
		{"POST", "/api/admin/sales", opTok, map[string]any{"name": "x", "startsAt": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
			"admissionRatePerSecond": 10, "items": []map[string]any{{"productId": 1, "quantity": 1, "priceCents": 1}}}},
		{"GET", "/api/admin/settings", opTok, nil},
		{"PUT", "/api/admin/settings", opTok, apptest.Permissive},
		{"POST", "/api/admin/settings/preset/normal", opTok, nil},
		{"GET", "/api/admin/audit", opTok, nil},
		{"GET", "/api/admin/defense", opTok, nil},
	} {
		noInternal(t, c.method+" "+c.path, s.Do(c.method, c.path, c.tok, c.body))
	}
	if r := s.purchase(102, items[0], at102); r.Status != 202 {
		t.Fatalf("purchase during the outage = %d %s, want 202", r.Status, r.Raw)
	}

	if _, err := localsvc.StartPostgres(context.Background(), localsvc.PostgresOptions{Dir: dir, Port: pg.Port, Fast: true, SyncCommit: true}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "/readyz 200 after PostgreSQL's restart", 30*time.Second, func() bool { return readyz(t, s) == 200 })
	// The writer stores the orders taken during the outage once the
	// database is back, after its retry backoff (up to 5 s). Wait for the
	// row in PostgreSQL itself: polling the order route would spend the
	// user's requests under the normal preset's per-user limit (set above),
	// and 429s are not what this test is about.
	ctx := context.Background()
	db, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The payment committed before the crash survived it.
	var status string
	if err := db.QueryRow(ctx, "SELECT status FROM orders WHERE id = $1", stored).Scan(&status); err != nil || status != "PAID" {
		t.Fatalf("order %s paid before the crash is %q (%v) after it, want PAID", stored, status, err)
	}
	testenv.Eventually(t, "order "+held+" stored by the writer", 60*time.Second, func() bool {
		var n int
		return db.QueryRow(ctx, "SELECT count(*) FROM orders WHERE id = $1", held).Scan(&n) == nil && n == 1
	})
	// A pooled connection broken by the crash may answer one more 503.
	testenv.Eventually(t, "order "+held+" payable", 30*time.Second, func() bool {
		r := s.Do("GET", "/api/flash-sales/orders/"+held, u101, nil)
		noInternal(t, "GET order after the restart", r)
		return r.Body["payable"] == true
	})
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+held+"/pay", u101, nil), 200, "")
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+stored+"/pay", s.Token(100, false), nil), 200, "")
}
