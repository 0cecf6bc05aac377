package browsertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/app"
	"github.com/flashsale/flashsale/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const testSecret = "browser-test-secret"

// permissive lifts the per-address and per-user limits: every request of
// these tests comes from one loopback address (the defense tests cover the
// limits).
const permissive = `{"rateLimit": {"perIp": {"rps": 100000, "burst": 100000}, "perUser": {"rps": 100000, "burst": 100000}},
	"pow": {"difficulty": 0}, "blocklist": {"cidrs": [], "users": []}}`

// stack is a whole flashsale in-process, as internal/app's e2e tests start it.
type stack struct {
	t   *testing.T
	app *app.App
	cl  *http.Client
}

func startStack(t *testing.T, mutate ...func(*app.Config)) *stack {
	t.Helper()
	cfg := app.Defaults()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.RedisURL = testenv.RedisURL(t)
	cfg.DatabaseURL = testenv.DatabaseURL(t)
	cfg.KafkaBrokers = testenv.NewKafka(t).Brokers
	cfg.JWTSecret = testSecret
	cfg.ExpiryInterval = 200 * time.Millisecond
	for _, m := range mutate {
		m(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("FLASHSALE_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	a, err := app.Start(context.Background(), cfg, app.AllRoles, log)
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
	if err := a.SetDefense(context.Background(), "test", []byte(permissive)); err != nil {
		t.Fatalf("settings: %v", err)
	}
	return &stack{t: t, app: a, cl: &http.Client{Timeout: 10 * time.Second}}
}

func (s *stack) token(user int64, operator bool) string {
	s.t.Helper()
	tok, err := auth.Mint(testSecret, user, operator, time.Hour, time.Now())
	if err != nil {
		s.t.Fatal(err)
	}
	return tok
}

type resp struct {
	Status int
	Body   map[string]any
	Raw    []byte
}

func (s *stack) do(method, path, bearer string, body any, hdr ...string) resp {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.app.PublicURL+path, rd)
	if err != nil {
		s.t.Fatal(err)
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
	r, err := s.cl.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer r.Body.Close()
	raw, _ := io.ReadAll(r.Body)
	out := resp{Status: r.StatusCode, Raw: raw}
	_ = json.Unmarshal(raw, &out.Body)
	return out
}

func (s *stack) want(r resp, status int) {
	s.t.Helper()
	if r.Status != status {
		s.t.Fatalf("status = %d, want %d; body %s", r.Status, status, r.Raw)
	}
}

// createSale creates a sale through the operator API, opening at startsAt,
// one item per quantity; it returns the sale and item ids.
func (s *stack) createSale(name string, startsAt time.Time, rate int, quantities ...int) (saleID int64, itemIDs []int64) {
	s.t.Helper()
	var items []map[string]any
	for i, q := range quantities {
		items = append(items, map[string]any{"productId": 501 + i, "quantity": q, "priceCents": 1999 + 1000*i})
	}
	r := s.do("POST", "/api/admin/sales", s.token(1, true), map[string]any{
		"name": name, "startsAt": startsAt.UTC().Format(time.RFC3339Nano),
		"admissionRatePerSecond": rate, "items": items,
	})
	s.want(r, 201)
	saleID = int64(r.Body["id"].(float64))
	for _, it := range r.Body["items"].([]any) {
		itemIDs = append(itemIDs, int64(it.(map[string]any)["id"].(float64)))
	}
	return saleID, itemIDs
}

func queuePath(saleID int64) string { return fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID) }

// join puts a user in the queue by the polling API.
func (s *stack) join(user, saleID int64) resp {
	s.t.Helper()
	r := s.do("POST", queuePath(saleID), s.token(user, false), nil)
	s.want(r, 200)
	return r
}

// admit joins and polls until the user is admitted; it returns the
// admission token.
func (s *stack) admit(user, saleID int64) string {
	s.t.Helper()
	s.join(user, saleID)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r := s.do("GET", queuePath(saleID), s.token(user, false), nil)
		s.want(r, 200)
		if at, ok := r.Body["admissionToken"].(string); ok && at != "" {
			return at
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("user %d not admitted to sale %d within 20s", user, saleID)
	return ""
}

// buy purchases an item over HTTP and returns the order id.
func (s *stack) buy(user, itemID int64, admissionToken string) string {
	s.t.Helper()
	r := s.do("POST", fmt.Sprintf("/api/flash-sales/items/%d/purchase", itemID), s.token(user, false), nil,
		"X-Admission-Token", admissionToken)
	s.want(r, 202)
	return r.Body["orderId"].(string)
}

func (s *stack) adminSale(saleID int64) map[string]any {
	s.t.Helper()
	r := s.do("GET", fmt.Sprintf("/api/admin/sales/%d", saleID), s.token(1, true), nil)
	s.want(r, 200)
	return r.Body
}

// shopperURL is the shopper page of a sale, signed in through the fragment.
func (s *stack) shopperURL(base string, saleID, user int64, query string) string {
	return fmt.Sprintf("%s/sales/%d%s#token=%s", base, saleID, query, s.token(user, false))
}

func (s *stack) operatorURL(saleID int64) string {
	return fmt.Sprintf("%s/operator?sale=%d#token=%s", s.app.PublicURL, saleID, s.token(1, true))
}
