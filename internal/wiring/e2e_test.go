package wiring_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// Tests that mostly wait on real windows (claim windows, pauses, lease
// lapses, failovers) call t.Parallel: each stack has a Redis database,
// PostgreSQL database and broker of its own, so they overlap (go test
// runs -parallel of them at once, GOMAXPROCS by default) and the
// package's wall time drops. A test that reads a shared server as a whole
// (MONITOR, command counts) or bounds a time tighter than a few seconds
// stays serial.
func TestMain(m *testing.M) {
	runChild() // a child process runs its part and exits (child_test.go)
	testenv.Main(m)
}

// stack is a whole flashsale in-process with this file's helpers.
type stack struct{ *apptest.Stack }

func startStack(t *testing.T, mutate ...func(*wiring.Config)) *stack {
	t.Helper()
	return &stack{apptest.Start(t, mutate...)}
}

// createSale creates an open sale through the operator API.
func (s *stack) createSale(quantities ...int) (saleID int64, itemIDs []int64) {
	s.T.Helper()
	var items []map[string]any
	for i, q := range quantities {
		items = append(items, map[string]any{"productId": 500 + i, "quantity": q, "priceCents": 1999})
	}
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": "e2e", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339),
		"admissionRatePerSecond": 10000, "items": items, "allocation": "race",
	})
	s.Want(r, 201, "")
	saleID = int64(r.Body["id"].(float64))
	for _, it := range r.Body["items"].([]any) {
		itemIDs = append(itemIDs, int64(it.(map[string]any)["id"].(float64)))
	}
	return saleID, itemIDs
}

// admit joins the waiting room by polling and returns the admission token.
func (s *stack) admit(user int64, saleID int64) string {
	s.T.Helper()
	tok := s.Token(user, false)
	path := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	s.Want(s.Do("POST", path, tok, nil), 200, "")
	return testenv.EventuallyValue(s.T, fmt.Sprintf("user %d to be admitted to sale %d", user, saleID), 15*time.Second, func() (string, bool) {
		r := s.Do("GET", path, tok, nil)
		s.Want(r, 200, "")
		at, _ := r.Body["admissionToken"].(string)
		return at, at != ""
	})
}

func (s *stack) purchase(user, itemID int64, admissionToken string) apptest.Resp {
	s.T.Helper()
	return s.Do("POST", fmt.Sprintf("/api/flash-sales/items/%d/purchase", itemID), s.Token(user, false), nil, "X-Admission-Token", admissionToken)
}

func (s *stack) waitPayable(user int64, orderID string) apptest.Resp {
	s.T.Helper()
	var r apptest.Resp
	testenv.EventuallyF(s.T, func() string { return fmt.Sprintf("order %s to be payable (last %s)", orderID, r.Raw) }, 15*time.Second, func() bool {
		r = s.Do("GET", "/api/flash-sales/orders/"+orderID, s.Token(user, false), nil)
		s.Want(r, 200, "")
		return r.Body["payable"] == true
	})
	return r
}

func (s *stack) figures(saleID int64) map[string]any {
	s.T.Helper()
	r := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d", saleID), s.Token(1, true), nil)
	s.Want(r, 200, "")
	return r.Body
}

func itemFigure(t *testing.T, fig map[string]any, itemID int64, field string) int64 {
	t.Helper()
	for _, it := range fig["items"].([]any) {
		m := it.(map[string]any)
		if int64(m["id"].(float64)) == itemID {
			v, ok := m[field].(float64)
			if !ok {
				t.Fatalf("item %d has no figure %q: %v", itemID, field, m)
			}
			return int64(v)
		}
	}
	t.Fatalf("item %d not in figures %v", itemID, fig)
	return 0
}

func TestPurchasePayCancelThroughHTTP(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale(5)
	item := items[0]

	// Buy, wait until the writer has it, pay.
	at := s.admit(100, saleID)
	r := s.purchase(100, item, at)
	s.Want(r, 202, "")
	if r.Body["status"] != "PENDING" {
		t.Fatalf("purchase body %s", r.Raw)
	}
	orderID := r.Body["orderId"].(string)
	s.Want(s.purchase(100, item, at), 409, "ALREADY_PURCHASED")
	if again := s.purchase(100, item, at); again.Body["orderId"] != orderID {
		t.Fatalf("ALREADY_PURCHASED names %v, want %s", again.Body["orderId"], orderID)
	}
	o := s.waitPayable(100, orderID)
	for _, f := range []string{"orderId", "saleId", "itemId", "status", "payable", "priceCents", "createdAt", "expiresAt"} {
		if _, ok := o.Body[f]; !ok {
			t.Errorf("order has no %q: %s", f, o.Raw)
		}
	}
	bySale := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), s.Token(100, false), nil)
	s.Want(bySale, 200, "")
	if bySale.Body["orderId"] != orderID {
		t.Fatalf("sale order = %s, want %s", bySale.Raw, orderID)
	}
	s.Want(s.Do("GET", "/api/flash-sales/orders/"+orderID, s.Token(101, false), nil), 404, "NOT_FOUND")
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+orderID+"/pay", s.Token(101, false), nil), 404, "NOT_FOUND")
	for i := 0; i < 2; i++ {
		p := s.Do("POST", "/api/flash-sales/orders/"+orderID+"/pay", s.Token(100, false), map[string]string{"paymentToken": "tok"})
		s.Want(p, 200, "")
		if p.Body["status"] != "PAID" {
			t.Fatalf("pay: %s", p.Raw)
		}
	}
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+orderID+"/cancel", s.Token(100, false), nil), 409, "ORDER_PAID")

	// Another shopper buys and cancels: the unit comes back exactly once.
	at2 := s.admit(200, saleID)
	r2 := s.purchase(200, item, at2)
	s.Want(r2, 202, "")
	order2 := r2.Body["orderId"].(string)
	s.waitPayable(200, order2)
	if got := itemFigure(t, s.figures(saleID), item, "remaining"); got != 3 {
		t.Fatalf("remaining = %d after two purchases, want 3", got)
	}
	for i := 0; i < 2; i++ {
		c := s.Do("POST", "/api/flash-sales/orders/"+order2+"/cancel", s.Token(200, false), nil)
		s.Want(c, 200, "")
		if c.Body["status"] != "CANCELLED" {
			t.Fatalf("cancel: %s", c.Raw)
		}
	}
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+order2+"/pay", s.Token(200, false), nil), 409, "ORDER_CANCELLED")
	fig := s.figures(saleID)
	if rem, sold := itemFigure(t, fig, item, "remaining"), itemFigure(t, fig, item, "sold"); rem != 4 || sold != 1 {
		t.Fatalf("after cancel remaining=%d sold=%d, want 4 and 1", rem, sold)
	}
	if c := itemFigure(t, fig, item, "cancelled"); c != 1 {
		t.Fatalf("cancelled = %d, want 1", c)
	}
	// After a cancel the shopper may buy again.
	s.Want(s.purchase(200, item, at2), 202, "")
}

func TestBadInputThroughHTTP(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale(3)
	item := items[0]
	at := s.admit(300, saleID)
	otherSale, otherItems := s.createSale(1)
	atOther := s.admit(300, otherSale)
	atForeign := s.admit(301, saleID)
	expired, err := auth.Mint(apptest.Secret, 300, false, -time.Minute, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := auth.Mint("not-the-secret", 300, false, time.Hour, time.Now())
	shopper := s.Token(300, false)
	purchasePath := fmt.Sprintf("/api/flash-sales/items/%d/purchase", item)
	// Far over the 16 KiB body limit and the socket buffers: the gateway
	// reads and drops it before its close, so the client writes it whole
	// and reads the 413 (CONTRACT, "Request limits").
	huge := strings.Repeat("x", 2<<20)
	tests := []struct {
		name         string
		method, path string
		bearer       string
		body         any
		hdr          []string
		status       int
		code         string
	}{
		{"purchase no access token", "POST", purchasePath, "", nil, []string{"X-Admission-Token", at}, 401, "UNAUTHENTICATED"},
		{"purchase expired access token", "POST", purchasePath, expired, nil, []string{"X-Admission-Token", at}, 401, "UNAUTHENTICATED"},
		{"purchase forged access token", "POST", purchasePath, forged, nil, []string{"X-Admission-Token", at}, 401, "UNAUTHENTICATED"},
		{"purchase no admission token", "POST", purchasePath, shopper, nil, nil, 403, "NOT_ADMITTED"},
		{"purchase garbage admission token", "POST", purchasePath, shopper, nil, []string{"X-Admission-Token", "garbage"}, 403, "NOT_ADMITTED"},
		{"purchase foreign admission token", "POST", purchasePath, shopper, nil, []string{"X-Admission-Token", atForeign}, 403, "NOT_ADMITTED"},
		{"purchase other-sale admission token", "POST", purchasePath, shopper, nil, []string{"X-Admission-Token", atOther}, 403, "NOT_ADMITTED"},
		{"purchase malformed item id", "POST", "/api/flash-sales/items/abc/purchase", shopper, nil, []string{"X-Admission-Token", at}, 400, "INVALID"},
		{"purchase negative item id", "POST", "/api/flash-sales/items/-5/purchase", shopper, nil, []string{"X-Admission-Token", at}, 400, "INVALID"},
		{"purchase overflowing item id", "POST", "/api/flash-sales/items/99999999999999999999999/purchase", shopper, nil, []string{"X-Admission-Token", at}, 400, "INVALID"},
		{"purchase unknown item", "POST", "/api/flash-sales/items/999999/purchase", shopper, nil, []string{"X-Admission-Token", at}, 404, "NOT_FOUND"},
		{"purchase huge body", "POST", purchasePath, shopper, huge, []string{"X-Admission-Token", at}, 413, "TOO_LARGE"},
		{"order malformed id", "GET", "/api/flash-sales/orders/not-a-uuid", shopper, nil, nil, 400, "INVALID"},
		{"order unknown id", "GET", "/api/flash-sales/orders/8d3f8a4e-4f0b-4c43-9a57-4d7f3f0c2b11", shopper, nil, nil, 404, "NOT_FOUND"},
		{"order no token", "GET", "/api/flash-sales/orders/8d3f8a4e-4f0b-4c43-9a57-4d7f3f0c2b11", "", nil, nil, 401, "UNAUTHENTICATED"},
		{"pay malformed id", "POST", "/api/flash-sales/orders/1'--/pay", shopper, nil, nil, 400, "INVALID"},
		{"cancel unknown", "POST", "/api/flash-sales/orders/8d3f8a4e-4f0b-4c43-9a57-4d7f3f0c2b11/cancel", shopper, nil, nil, 404, "NOT_FOUND"},
		{"sale order none held", "GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), shopper, nil, nil, 404, "NOT_FOUND"},
		{"sale order malformed sale", "GET", "/api/flash-sales/sales/x/order", shopper, nil, nil, 400, "INVALID"},
		{"public sale unknown", "GET", "/api/flash-sales/sales/987654", "", nil, nil, 404, "NOT_FOUND"},
		{"admin no token", "POST", "/api/admin/sales", "", map[string]any{}, nil, 401, "UNAUTHENTICATED"},
		{"admin shopper token", "POST", "/api/admin/sales", shopper, map[string]any{}, nil, 403, "FORBIDDEN"},
		{"admin no items", "POST", "/api/admin/sales", s.Token(1, true), map[string]any{"name": "x", "startsAt": "2026-12-01T18:00:00Z", "admissionRatePerSecond": 5, "items": []any{}}, nil, 400, "INVALID"},
		{"admin zero quantity", "POST", "/api/admin/sales", s.Token(1, true), map[string]any{"name": "x", "startsAt": "2026-12-01T18:00:00Z", "admissionRatePerSecond": 5, "items": []any{map[string]any{"productId": 1, "quantity": 0, "priceCents": 1}}}, nil, 400, "INVALID"},
		{"admin bad startsAt", "POST", "/api/admin/sales", s.Token(1, true), map[string]any{"name": "x", "startsAt": "tomorrow", "admissionRatePerSecond": 5, "items": []any{map[string]any{"productId": 1, "quantity": 1, "priceCents": 1}}}, nil, 400, "INVALID"},
		{"admin wrong type", "POST", "/api/admin/sales", s.Token(1, true), `{"name": 5}`, nil, 400, "INVALID"},
		{"admin not json", "POST", "/api/admin/sales", s.Token(1, true), `{{{`, nil, 400, "INVALID"},
		{"admin unknown sale", "GET", "/api/admin/sales/424242", s.Token(1, true), nil, nil, 404, "NOT_FOUND"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.T = t
			r := s.Do(tt.method, tt.path, tt.bearer, tt.body, tt.hdr...)
			s.Want(r, tt.status, tt.code)
			if msg, _ := r.Body["message"].(string); msg == "" && tt.status != 413 {
				t.Errorf("no message in %s", r.Raw)
			}
		})
	}
	s.T = t
	// Nothing was reserved by any of that.
	if rem := itemFigure(t, s.figures(saleID), item, "remaining"); rem != 3 {
		t.Fatalf("remaining = %d after bad requests, want 3", rem)
	}
	if rem := itemFigure(t, s.figures(otherSale), otherItems[0], "remaining"); rem != 1 {
		t.Fatalf("other sale remaining = %d, want 1", rem)
	}
}

func TestHealthAndReady(t *testing.T) {
	s := startStack(t)
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		r, err := http.Get(s.App.AdminURL + p)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("%s = %d, want 200", p, r.StatusCode)
		}
	}
}

func TestSaleChangesAreAudited(t *testing.T) {
	s := startStack(t)
	saleID, _ := s.createSale(5)
	op := s.Token(9, true)
	s.Want(s.Do("PATCH", fmt.Sprintf("/api/admin/sales/%d", saleID), op, map[string]any{"admissionRatePerSecond": 7}), 200, "")
	r := s.Do("GET", "/api/admin/audit", op, nil)
	s.Want(r, 200, "")
	var entries []struct {
		Actor, Action string
		Body          map[string]any
	}
	if err := json.Unmarshal(r.Raw, &entries); err != nil {
		t.Fatalf("audit: %s", r.Raw)
	}
	var sawCreate, sawUpdate bool
	for _, e := range entries {
		switch {
		case e.Action == "sale.create" && e.Actor == "1" && e.Body["saleId"] == float64(saleID):
			sawCreate = true
		case e.Action == "sale.update" && e.Actor == "9" && e.Body["admissionRatePerSecond"] == float64(7):
			sawUpdate = true
		}
	}
	if !sawCreate || !sawUpdate {
		t.Fatalf("audit log lacks the sale's create (%v) or rate change (%v): %s", sawCreate, sawUpdate, r.Raw)
	}
}
