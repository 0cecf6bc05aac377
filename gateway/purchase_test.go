package gateway

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/admission"
	"github.com/flashsale/flashsale/auth"
)

func TestPurchase(t *testing.T) {
	e := newEnv(t)
	user := e.token(7, false)
	expiredTok, err := auth.Mint(testSecret, 7, false, time.Minute, testNow.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _ := admission.NewSigner(admission.Key{ID: 1, Secret: []byte("some-other-secret-0123456789")})
	forged := otherKey.Sign(flashsale.Admission{UserID: 7, SaleID: 1, ExpiresAt: testNow.Add(time.Minute)})
	expiredAdm := e.adm.Sign(flashsale.Admission{UserID: 7, SaleID: 1, ExpiresAt: testNow})
	good := e.admit(7, 1)

	const path = "/api/flash-sales/items/101/purchase"
	tests := []struct {
		name        string
		path        string
		headers     []string
		body        string
		reserve     func(*flashsale.Sale, flashsale.Item, int64) (string, error)
		wantStatus  int
		wantCode    string
		wantReserve bool
	}{
		{name: "reserved", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good}, wantStatus: 202, wantReserve: true},
		{name: "no access token", path: path, headers: []string{HeaderAdmissionToken, good}, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "garbage access token", path: path, headers: []string{"Authorization", "Bearer x.y.z", HeaderAdmissionToken, good}, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "not bearer", path: path, headers: []string{"Authorization", "Basic " + user, HeaderAdmissionToken, good}, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "expired access token", path: path, headers: []string{"Authorization", bearer(expiredTok), HeaderAdmissionToken, good}, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "forged access token", path: path, headers: []string{"Authorization", bearer(user[:len(user)-2] + "xx"), HeaderAdmissionToken, good}, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "no admission token", path: path, headers: []string{"Authorization", bearer(user)}, wantStatus: 403, wantCode: "NOT_ADMITTED"},
		{name: "garbage admission token", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, "nope"}, wantStatus: 403, wantCode: "NOT_ADMITTED"},
		{name: "forged admission token", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, forged}, wantStatus: 403, wantCode: "NOT_ADMITTED"},
		{name: "expired admission token", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, expiredAdm}, wantStatus: 403, wantCode: "NOT_ADMITTED"},
		{name: "foreign admission token", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, e.admit(8, 1)}, wantStatus: 403, wantCode: "NOT_ADMITTED"},
		{name: "other sale admission token", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, e.admit(7, 2)}, wantStatus: 403, wantCode: "NOT_ADMITTED"},
		{name: "sale not open yet", path: "/api/flash-sales/items/201/purchase", headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, e.admit(7, 2)}, wantStatus: 403, wantCode: "NOT_ADMITTED"},
		{name: "sale ended", path: "/api/flash-sales/items/301/purchase", headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, e.admit(7, 3)}, wantStatus: 403, wantCode: "NOT_ADMITTED"},
		{name: "sold out", path: "/api/flash-sales/items/102/purchase", headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good}, wantStatus: 410, wantCode: "SOLD_OUT"},
		{name: "sold out without admission", path: "/api/flash-sales/items/102/purchase", headers: []string{"Authorization", bearer(user)}, wantStatus: 410, wantCode: "SOLD_OUT"},
		{name: "sold out without access token", path: "/api/flash-sales/items/102/purchase", wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "blocked user sold out", path: "/api/flash-sales/items/102/purchase", headers: []string{"Authorization", bearer(e.token(42, false))}, wantStatus: 403, wantCode: "BLOCKED"},
		{name: "unknown item without access token", path: "/api/flash-sales/items/999/purchase", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "malformed id without access token", path: "/api/flash-sales/items/x/purchase", wantStatus: 400, wantCode: "INVALID"},
		{name: "blocked address sold out", path: "/api/flash-sales/items/102/purchase", headers: []string{"X-Forwarded-For", "203.0.113.5"}, wantStatus: 403, wantCode: "BLOCKED"},
		{name: "unknown item", path: "/api/flash-sales/items/999/purchase", headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good}, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "letters id", path: "/api/flash-sales/items/abc/purchase", headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good}, wantStatus: 400, wantCode: "INVALID"},
		{name: "zero id", path: "/api/flash-sales/items/0/purchase", headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good}, wantStatus: 400, wantCode: "INVALID"},
		{name: "negative id", path: "/api/flash-sales/items/-101/purchase", headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good}, wantStatus: 400, wantCode: "INVALID"},
		{name: "overflow id", path: "/api/flash-sales/items/99999999999999999999/purchase", headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good}, wantStatus: 400, wantCode: "INVALID"},
		{name: "blocked address", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good, "X-Forwarded-For", "203.0.113.5"}, wantStatus: 403, wantCode: "BLOCKED"},
		{name: "rate limited address", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good, "X-Forwarded-For", "198.51.100.9"}, wantStatus: 429, wantCode: "RATE_LIMITED"},
		{name: "blocked user", path: path, headers: []string{"Authorization", bearer(e.token(42, false)), HeaderAdmissionToken, e.admit(42, 1)}, wantStatus: 403, wantCode: "BLOCKED"},
		{name: "rate limited user", path: path, headers: []string{"Authorization", bearer(e.token(43, false)), HeaderAdmissionToken, e.admit(43, 1)}, wantStatus: 429, wantCode: "RATE_LIMITED"},
		{name: "small body ignored", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good}, body: strings.Repeat("x", 1<<10), wantStatus: 202, wantReserve: true},
		{name: "already purchased", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good},
			reserve: func(*flashsale.Sale, flashsale.Item, int64) (string, error) {
				return "", &flashsale.Error{Code: flashsale.CodeAlreadyPurchased, Message: "one per sale", OrderID: orderA}
			}, wantStatus: 409, wantCode: "ALREADY_PURCHASED", wantReserve: true},
		{name: "sold out in redis", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good},
			reserve: func(*flashsale.Sale, flashsale.Item, int64) (string, error) {
				return "", flashsale.Errorf(flashsale.CodeSoldOut, "sold out")
			}, wantStatus: 410, wantCode: "SOLD_OUT", wantReserve: true},
		{name: "redis down", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good},
			reserve: func(*flashsale.Sale, flashsale.Item, int64) (string, error) {
				return "", flashsale.Errorf(flashsale.CodeUnavailable, "try again")
			}, wantStatus: 503, wantCode: "UNAVAILABLE", wantReserve: true},
		{name: "internal error", path: path, headers: []string{"Authorization", bearer(user), HeaderAdmissionToken, good},
			reserve: func(*flashsale.Sale, flashsale.Item, int64) (string, error) {
				return "", errBoom
			}, wantStatus: 500, wantCode: "INTERNAL", wantReserve: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.purchase.reserve = tt.reserve
			before := e.purchase.calls.Load()
			r := e.do("POST", tt.path, tt.body, tt.headers...)
			if r.status != tt.wantStatus {
				t.Errorf("status = %d, want %d (body %s)", r.status, tt.wantStatus, r.body)
			}
			if tt.wantCode != "" && r.errCode() != tt.wantCode {
				t.Errorf("error = %q, want %q (body %s)", r.errCode(), tt.wantCode, r.body)
			}
			if got := e.purchase.calls.Load() - before; got != map[bool]int64{true: 1, false: 0}[tt.wantReserve] {
				t.Errorf("Reserve called %d times, want reserve=%v", got, tt.wantReserve)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if r.status == 429 || r.status == 503 {
				if ra := r.header.Get("Retry-After"); ra == "" || ra == "0" {
					t.Errorf("Retry-After = %q", ra)
				}
			}
		})
	}

	t.Run("bodies", func(t *testing.T) {
		e.purchase.reserve = nil
		var ok struct{ OrderID, Status string }
		e.do("POST", path, "", "Authorization", bearer(user), HeaderAdmissionToken, good).json(t, &ok)
		if ok.OrderID != orderA || ok.Status != "PENDING" {
			t.Errorf("202 body = %+v", ok)
		}
		e.purchase.reserve = func(*flashsale.Sale, flashsale.Item, int64) (string, error) {
			return "", &flashsale.Error{Code: flashsale.CodeAlreadyPurchased, Message: "one per sale", OrderID: orderA}
		}
		var dup struct{ Error, Message, OrderID string }
		e.do("POST", path, "", "Authorization", bearer(user), HeaderAdmissionToken, good).json(t, &dup)
		if dup.OrderID != orderA || dup.Error != "ALREADY_PURCHASED" || dup.Message == "" {
			t.Errorf("409 body = %+v", dup)
		}
		e.purchase.reserve = func(*flashsale.Sale, flashsale.Item, int64) (string, error) { return "", errBoom }
		r := e.do("POST", path, "", "Authorization", bearer(user), HeaderAdmissionToken, good)
		if strings.Contains(string(r.body), "fire") {
			t.Errorf("internal error leaked: %s", r.body)
		}
		r = e.do("POST", path, "", "Authorization", bearer(user), HeaderAdmissionToken, good, "X-Forwarded-For", "198.51.100.9")
		if got := r.header.Get("Retry-After"); got != "3" {
			t.Errorf("Retry-After = %q, want 3 (2.5s rounded up)", got)
		}
	})
}

// TestPurchaseCheckOrder shows the cheap checks run first.
func TestPurchaseCheckOrder(t *testing.T) {
	e := newEnv(t)
	user := e.token(7, false)

	t.Run("blocked address never reaches token verification", func(t *testing.T) {
		before := e.access.calls.Load()
		r := e.do("POST", "/api/flash-sales/items/101/purchase", "", "Authorization", bearer(user), "X-Forwarded-For", "203.0.113.5")
		if r.status != 403 || r.errCode() != "BLOCKED" {
			t.Fatalf("got %d %s", r.status, r.body)
		}
		if got := e.access.calls.Load() - before; got != 0 {
			t.Errorf("access verifier called %d times", got)
		}
	})
	t.Run("guard class is purchase", func(t *testing.T) {
		if _, ok := e.guard.classes.Load(ClassPurchase); !ok {
			t.Error("CheckAddr never saw class purchase")
		}
	})
	t.Run("no admission token and sold out never reserves", func(t *testing.T) {
		before := e.purchase.calls.Load()
		for _, item := range []string{"101", "102"} {
			e.do("POST", "/api/flash-sales/items/"+item+"/purchase", "", "Authorization", bearer(user))
		}
		e.do("POST", "/api/flash-sales/items/102/purchase", "", "Authorization", bearer(user), HeaderAdmissionToken, e.admit(7, 1))
		if got := e.purchase.calls.Load() - before; got != 0 {
			t.Errorf("Reserve called %d times", got)
		}
	})
	t.Run("sold out answers before the admission token and Reserve", func(t *testing.T) {
		before := e.purchase.calls.Load()
		r := e.do("POST", "/api/flash-sales/items/102/purchase", "", "Authorization", bearer(user), HeaderAdmissionToken, "garbage")
		if r.status != 410 {
			t.Fatalf("got %d %s, want 410 (the flag answers before the admission token is checked)", r.status, r.body)
		}
		if got := e.purchase.calls.Load() - before; got != 0 {
			t.Errorf("Reserve called %d times", got)
		}
	})
	t.Run("no access token never reaches the admission check or Reserve", func(t *testing.T) {
		before := e.purchase.calls.Load()
		r := e.do("POST", "/api/flash-sales/items/101/purchase", "", HeaderAdmissionToken, e.admit(7, 1))
		if r.status != 401 {
			t.Errorf("status = %d, want 401", r.status)
		}
		if got := e.purchase.calls.Load() - before; got != 0 {
			t.Errorf("Reserve called %d times", got)
		}
	})
}

// TestSaleRequestsCounted: every purchase and order request that reaches
// its handler is counted for the waiting room's pacing (refused ones too:
// they cost the gateway as much); other routes are not.
func TestSaleRequestsCounted(t *testing.T) {
	var n atomic.Int64
	e := newEnv(t, func(c *Config, _ *Deps) { c.SaleRequests = &n })
	user := []string{"Authorization", bearer(e.token(7, false))}
	for _, tc := range []struct {
		method, path string
		headers      []string
		counted      int64
	}{
		{"POST", "/api/flash-sales/items/101/purchase", append(user, HeaderAdmissionToken, e.admit(7, 1)), 1},
		{"POST", "/api/flash-sales/items/102/purchase", user, 1}, // sold out: 410
		{"POST", "/api/flash-sales/items/101/purchase", nil, 1},  // no token: 401
		{"GET", "/api/flash-sales/orders/" + orderA, user, 1},
		{"POST", "/api/flash-sales/orders/" + orderA + "/pay", user, 1},
		{"POST", "/api/flash-sales/orders/" + orderA + "/cancel", user, 1},
		{"GET", "/api/flash-sales/sales/1", nil, 0},
		{"GET", "/healthz", nil, 0},
	} {
		before := n.Load()
		e.do(tc.method, tc.path, "", tc.headers...)
		if got := n.Load() - before; got != tc.counted {
			t.Errorf("%s %s counted %d, want %d", tc.method, tc.path, got, tc.counted)
		}
	}
}
