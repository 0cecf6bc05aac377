package gateway

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

type routeCase struct {
	name       string
	method     string
	path       string
	body       string
	headers    []string
	wantStatus int
	wantCode   string // error code, when an error is expected
	check      func(t *testing.T, r resp)
}

func runCases(t *testing.T, e *env, tests []routeCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(tt.method, tt.path, tt.body, tt.headers...)
			if r.status != tt.wantStatus {
				t.Errorf("status = %d, want %d (body %s)", r.status, tt.wantStatus, r.body)
			}
			if tt.wantCode != "" {
				if r.errCode() != tt.wantCode {
					t.Errorf("error = %q, want %q (body %s)", r.errCode(), tt.wantCode, r.body)
				}
				var b map[string]any
				r.json(t, &b)
				if msg, _ := b["message"].(string); msg == "" {
					t.Errorf("error body without message: %s", r.body)
				}
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

func TestOrders(t *testing.T) {
	e := newEnv(t)
	auth7 := []string{"Authorization", bearer(e.token(7, false))}
	auth8 := []string{"Authorization", bearer(e.token(8, false))}
	const o = "/api/flash-sales/orders/"
	runCases(t, e, []routeCase{
		{name: "get", method: "GET", path: o + orderA, headers: auth7, wantStatus: 200, check: func(t *testing.T, r resp) {
			var got map[string]any
			r.json(t, &got)
			want := map[string]any{"orderId": orderA, "saleId": 1.0, "itemId": 101.0, "status": "PENDING", "payable": true,
				"priceCents": 1999.0, "createdAt": "2026-12-01T18:00:00Z", "expiresAt": "2026-12-01T18:10:00Z"}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
			if len(got) != len(want) {
				t.Errorf("fields = %v", got)
			}
		}},
		{name: "get upper-case id", method: "GET", path: o + strings.ToUpper(orderA), headers: auth7, wantStatus: 200},
		{name: "get someone else's", method: "GET", path: o + orderA, headers: auth8, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "get unknown", method: "GET", path: o + "44444444-2222-4333-8444-555555555555", headers: auth7, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "get malformed id", method: "GET", path: o + "not-a-uuid", headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "get no token", method: "GET", path: o + orderA, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "get bad token", method: "GET", path: o + orderA, headers: []string{"Authorization", "Bearer nope"}, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "pay", method: "POST", path: o + orderA + "/pay", headers: auth7, wantStatus: 200, check: func(t *testing.T, r resp) {
			var got struct{ OrderID, Status string }
			r.json(t, &got)
			if got.OrderID != orderA || got.Status != "PAID" {
				t.Errorf("body = %+v", got)
			}
		}},
		{name: "pay with payment token", method: "POST", path: o + orderA + "/pay", body: `{"paymentToken":"tok_1"}`, headers: auth7, wantStatus: 200},
		{name: "pay with wrong type", method: "POST", path: o + orderA + "/pay", body: `{"paymentToken":5}`, headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "pay with unknown field", method: "POST", path: o + orderA + "/pay", body: `{"amount":5}`, headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "pay with bad JSON", method: "POST", path: o + orderA + "/pay", body: `{`, headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "pay bad body no token", method: "POST", path: o + orderA + "/pay", body: `{`, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "pay expired", method: "POST", path: o + orderExpired + "/pay", headers: auth7, wantStatus: 409, wantCode: "ORDER_EXPIRED"},
		{name: "pay not payable yet", method: "POST", path: o + orderUnpay + "/pay", headers: auth8, wantStatus: 409, wantCode: "NOT_PAYABLE_YET"},
		{name: "pay malformed", method: "POST", path: o + "123/pay", headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "pay someone else's", method: "POST", path: o + orderA + "/pay", headers: auth8, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "cancel", method: "POST", path: o + orderA + "/cancel", headers: auth7, wantStatus: 200, check: func(t *testing.T, r resp) {
			var got struct{ Status string }
			r.json(t, &got)
			if got.Status != "CANCELLED" {
				t.Errorf("status = %q", got.Status)
			}
		}},
		{name: "cancel paid", method: "POST", path: o + orderPaid + "/cancel", headers: auth7, wantStatus: 409, wantCode: "ORDER_PAID"},
		{name: "cancel no token", method: "POST", path: o + orderA + "/cancel", wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "cancel malformed", method: "POST", path: o + orderA + "x/cancel", headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "by sale", method: "GET", path: "/api/flash-sales/sales/1/order", headers: auth7, wantStatus: 200, check: func(t *testing.T, r resp) {
			var got struct{ OrderID string }
			r.json(t, &got)
			if got.OrderID != orderA {
				t.Errorf("orderId = %q", got.OrderID)
			}
		}},
		{name: "by sale none", method: "GET", path: "/api/flash-sales/sales/1/order", headers: auth8, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "by sale malformed", method: "GET", path: "/api/flash-sales/sales/x/order", headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "by sale no token", method: "GET", path: "/api/flash-sales/sales/1/order", wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "panic is 500", method: "GET", path: o + panicOrderID, headers: auth7, wantStatus: 500, wantCode: "INTERNAL"},
	})
}

func TestPublicSale(t *testing.T) {
	e := newEnv(t)
	runCases(t, e, []routeCase{
		{name: "open sale", method: "GET", path: "/api/flash-sales/sales/1", wantStatus: 200, check: func(t *testing.T, r resp) {
			var got struct {
				ID                int64   `json:"id"`
				Name              string  `json:"name"`
				StartsAt          string  `json:"startsAt"`
				ServerTimeMs      int64   `json:"serverTimeMs"`
				State             string  `json:"state"`
				ShuffleCommitment string  `json:"shuffleCommitment"`
				ShuffleSeed       *string `json:"shuffleSeed"`
				Items             []struct {
					ID, ProductID, PriceCents int64
					SoldOut                   bool
				} `json:"items"`
			}
			r.json(t, &got)
			if got.ID != 1 || got.State != "OPEN" || got.ServerTimeMs != testNow.UnixMilli() || got.StartsAt != "2026-12-01T17:59:00Z" ||
				got.ShuffleCommitment != "c0ffee" || got.ShuffleSeed == nil || len(*got.ShuffleSeed) != 64 {
				t.Errorf("sale = %+v", got)
			}
			if len(got.Items) != 2 || got.Items[0].SoldOut || !got.Items[1].SoldOut || got.Items[0].PriceCents != 1999 || got.Items[0].ProductID != 501 {
				t.Errorf("items = %+v", got.Items)
			}
			if cc := r.header.Get("Cache-Control"); cc != "public, max-age=1" {
				t.Errorf("Cache-Control = %q", cc)
			}
			if strings.Contains(string(r.body), "purchase") || strings.Contains(string(r.body), "token") {
				t.Errorf("public sale leaks a purchase URL or token: %s", r.body)
			}
		}},
		{name: "scheduled sale hides the seed", method: "GET", path: "/api/flash-sales/sales/2", wantStatus: 200, check: func(t *testing.T, r resp) {
			var got map[string]any
			r.json(t, &got)
			if got["state"] != "SCHEDULED" {
				t.Errorf("state = %v", got["state"])
			}
			if _, ok := got["shuffleSeed"]; ok {
				t.Errorf("seed published before opening: %s", r.body)
			}
		}},
		{name: "ended", method: "GET", path: "/api/flash-sales/sales/3", wantStatus: 200, check: func(t *testing.T, r resp) {
			if !strings.Contains(string(r.body), `"state":"ENDED"`) {
				t.Errorf("body %s", r.body)
			}
		}},
		{name: "unknown", method: "GET", path: "/api/flash-sales/sales/99", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "malformed", method: "GET", path: "/api/flash-sales/sales/1e3", wantStatus: 400, wantCode: "INVALID"},
	})

	t.Run("sold out when every item is out", func(t *testing.T) {
		e.purchase.mu.Lock()
		e.purchase.soldOut[101] = true
		e.purchase.mu.Unlock()
		defer func() { e.purchase.mu.Lock(); delete(e.purchase.soldOut, 101); e.purchase.mu.Unlock() }()
		if r := e.do("GET", "/api/flash-sales/sales/1", ""); !strings.Contains(string(r.body), `"state":"SOLD_OUT"`) {
			t.Errorf("body %s", r.body)
		}
	})
	t.Run("remaining is fetched at most once a second", func(t *testing.T) {
		before := e.sales.remCalls.Load()
		for range 20 {
			e.do("GET", "/api/flash-sales/sales/1", "")
		}
		if got := e.sales.remCalls.Load() - before; got != 0 {
			t.Errorf("Remaining called %d times within one second", got)
		}
	})
	t.Run("remaining down still answers", func(t *testing.T) {
		e2 := newEnv(t)
		e2.sales.remErr = errBoom
		r := e2.do("GET", "/api/flash-sales/sales/1", "")
		if r.status != 200 || !strings.Contains(string(r.body), `"soldOut":true`) {
			t.Errorf("got %d %s", r.status, r.body)
		}
	})
	t.Run("list", func(t *testing.T) {
		e2 := newEnv(t)
		for _, s := range e2.sales.sales {
			e2.admin.sales[s.ID] = *s
		}
		e2.admin.nextID = 3
		r := e2.do("GET", "/api/flash-sales/sales", "")
		var got []struct {
			ID    int64  `json:"id"`
			State string `json:"state"`
		}
		r.json(t, &got)
		if r.status != 200 || len(got) != 2 || got[0].ID != 1 || got[1].ID != 2 || got[1].State != "SCHEDULED" {
			t.Errorf("got %d %s", r.status, r.body)
		}
		e3 := newEnv(t)
		e3.admin.err = errBoom
		if r := e3.do("GET", "/api/flash-sales/sales", ""); r.status != 500 || r.errCode() != "INTERNAL" {
			t.Errorf("list with store down: %d %s", r.status, r.body)
		}
	})
}

func TestQueuePolling(t *testing.T) {
	e := newEnv(t)
	auth7 := []string{"Authorization", bearer(e.token(7, false))}
	q := "/api/flash-sales/sales/1/queue"
	runCases(t, e, []routeCase{
		{name: "join", method: "POST", path: q, headers: auth7, wantStatus: 200, check: func(t *testing.T, r resp) {
			var got struct {
				State    string `json:"state"`
				UserID   int64  `json:"userId"`
				Position int    `json:"position"`
			}
			r.json(t, &got)
			if got.State != "WAITING" || got.UserID != 7 || got.Position != 3 {
				t.Errorf("status = %s", r.body)
			}
		}},
		{name: "join with pow", method: "POST", path: q, body: `{"pow":{"nonce":"abc"}}`, headers: append(auth7, "X-Forwarded-For", "192.0.2.77"), wantStatus: 200, check: func(t *testing.T, r resp) {
			if got := string(e.queue.joinPoW.Load().(json.RawMessage)); got != `{"nonce":"abc"}` {
				t.Errorf("pow = %s", got)
			}
			if got := e.queue.joinIP.Load().(netip.Addr); got != netip.MustParseAddr("192.0.2.77") {
				t.Errorf("ip = %v", got)
			}
		}},
		{name: "join wrong body type", method: "POST", path: q, body: `{"pow":"x","extra":1}`, headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "join body not an object", method: "POST", path: q, body: `[1]`, headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "join no token", method: "POST", path: q, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "join blocked", method: "POST", path: q, headers: append(auth7, "X-Forwarded-For", "203.0.113.5"), wantStatus: 403, wantCode: "BLOCKED"},
		{name: "join blocked user", method: "POST", path: q, headers: []string{"Authorization", bearer(e.token(42, false))}, wantStatus: 403, wantCode: "BLOCKED"},
		{name: "join limited address", method: "POST", path: q, headers: append(auth7, "X-Forwarded-For", "198.51.100.9"), wantStatus: 429, wantCode: "RATE_LIMITED"},
		{name: "join limited user", method: "POST", path: q, headers: []string{"Authorization", bearer(e.token(43, false))}, wantStatus: 429, wantCode: "RATE_LIMITED"},
		{name: "join blocked, unknown sale", method: "POST", path: "/api/flash-sales/sales/99/queue", headers: append(auth7, "X-Forwarded-For", "203.0.113.5"), wantStatus: 403, wantCode: "BLOCKED"},
		{name: "join blocked, malformed sale", method: "POST", path: "/api/flash-sales/sales/one/queue", headers: append(auth7, "X-Forwarded-For", "203.0.113.5"), wantStatus: 403, wantCode: "BLOCKED"},
		{name: "join unknown sale", method: "POST", path: "/api/flash-sales/sales/99/queue", headers: auth7, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "join malformed sale", method: "POST", path: "/api/flash-sales/sales/one/queue", headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "status", method: "GET", path: q, headers: auth7, wantStatus: 200, check: func(t *testing.T, r resp) {
			if !strings.Contains(string(r.body), `"state":"ADMITTED"`) {
				t.Errorf("body %s", r.body)
			}
		}},
		{name: "status no token", method: "GET", path: q, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "status unknown sale", method: "GET", path: "/api/flash-sales/sales/99/queue", headers: auth7, wantStatus: 404, wantCode: "NOT_FOUND"},
	})
	if _, ok := e.guard.classes.Load(ClassJoin); !ok {
		t.Error("CheckAddr never saw class join")
	}
	// The guard's refusals of joins of a known sale reach its report, by
	// rule; those naming an unknown or malformed sale do not.
	if got, want := e.queue.refusals(), "map[1/blocklist:2 1/perAddress:1 1/perUser:1]"; got != want {
		t.Errorf("refusals counted = %s, want %s", got, want)
	}
	e.queue.joinErr = flashsale.Errorf(flashsale.CodeRateLimited, "pow required")
	if r := e.do("POST", q, "", auth7...); r.status != 429 || r.header.Get("Retry-After") != "1" {
		t.Errorf("queue refusal: %d %v %s", r.status, r.header, r.body)
	}
}

func TestAdmin(t *testing.T) {
	e := newEnv(t)
	op := []string{"Authorization", bearer(e.token(1, true)), "Content-Type", "application/json"}
	user := []string{"Authorization", bearer(e.token(7, false))}
	const valid = `{"name":"Winter drop","startsAt":"2026-12-01T18:30:00Z","admissionRatePerSecond":2000,
		"items":[{"productId":501,"quantity":10000,"priceCents":1999},{"productId":502,"quantity":5,"priceCents":0}]}`

	// Every operator route: 401 without token, 401 with a bad one, 403 for a shopper.
	for _, rt := range []struct{ method, path string }{
		{"POST", "/api/admin/sales"}, {"GET", "/api/admin/sales"}, {"GET", "/api/admin/sales/1"}, {"PATCH", "/api/admin/sales/1"},
		{"GET", "/api/admin/settings"}, {"PUT", "/api/admin/settings"}, {"POST", "/api/admin/settings/preset/strict"},
		{"GET", "/api/admin/audit"}, {"GET", "/api/admin/defense"}, {"GET", "/api/admin/sales/1/report"},
	} {
		runCases(t, e, []routeCase{
			{name: rt.method + rt.path + " no token", method: rt.method, path: rt.path, body: valid, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
			{name: rt.method + rt.path + " bad token", method: rt.method, path: rt.path, body: valid, headers: []string{"Authorization", "Bearer x"}, wantStatus: 401, wantCode: "UNAUTHENTICATED"},
			{name: rt.method + rt.path + " shopper", method: rt.method, path: rt.path, body: valid, headers: user, wantStatus: 403, wantCode: "FORBIDDEN"},
		})
	}
	if len(e.admin.sales) != 0 {
		t.Fatal("a refused request created a sale")
	}

	runCases(t, e, []routeCase{
		{name: "create", method: "POST", path: "/api/admin/sales", body: valid, headers: op, wantStatus: 201, check: func(t *testing.T, r resp) {
			var got struct {
				ID                     int64  `json:"id"`
				Name                   string `json:"name"`
				StartsAt               string `json:"startsAt"`
				State                  string `json:"state"`
				AdmissionRatePerSecond int    `json:"admissionRatePerSecond"`
				StockShards            int    `json:"stockShards"`
				ShuffleCommitment      string `json:"shuffleCommitment"`
				Items                  []struct {
					ID, ProductID, Quantity, PriceCents int64
				} `json:"items"`
			}
			r.json(t, &got)
			if got.ID != 1 || got.Name != "Winter drop" || got.State != "SCHEDULED" || got.AdmissionRatePerSecond != 2000 || got.StockShards != 1 ||
				got.StartsAt != "2026-12-01T18:30:00Z" || len(got.ShuffleCommitment) != 64 || len(got.Items) != 2 ||
				got.Items[0].ID != 1001 || got.Items[0].Quantity != 10000 || got.Items[1].PriceCents != 0 {
				t.Errorf("created = %s", r.body)
			}
			if r.header.Get("Location") != "/api/admin/sales/1" {
				t.Errorf("Location = %q", r.header.Get("Location"))
			}
		}},
		{name: "list", method: "GET", path: "/api/admin/sales", headers: op, wantStatus: 200, check: func(t *testing.T, r resp) {
			var got []map[string]any
			r.json(t, &got)
			if len(got) != 1 || got[0]["name"] != "Winter drop" {
				t.Errorf("list = %s", r.body)
			}
		}},
		{name: "get with figures", method: "GET", path: "/api/admin/sales/1", headers: op, wantStatus: 200, check: func(t *testing.T, r resp) {
			var got struct {
				Items []struct {
					ID, Quantity, Remaining, Sold, Paid, Expired, Cancelled int64
					Rejected                                                *int64
				} `json:"items"`
				Queue *flashsale.QueueFigures `json:"queue"`
			}
			r.json(t, &got)
			it := got.Items[0]
			if it.Remaining != 9997 || it.Sold != 3 || it.Paid != 1 || it.Expired != 2 || it.Cancelled != 1 || it.Rejected == nil || it.Remaining+it.Sold != it.Quantity {
				t.Errorf("figures = %s", r.body)
			}
			if got.Queue == nil || *got.Queue != (flashsale.QueueFigures{Joined: 10, Admitted: 4, Waiting: 6}) {
				t.Errorf("queue = %s", r.body)
			}
		}},
		{name: "get unknown", method: "GET", path: "/api/admin/sales/9", headers: op, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "report", method: "GET", path: "/api/admin/sales/1/report", headers: op, wantStatus: 200, check: func(t *testing.T, r resp) {
			var got struct {
				SaleID int64                 `json:"saleId"`
				State  string                `json:"state"`
				Final  bool                  `json:"final"`
				Items  []struct{ ID int64 }  `json:"items"`
				Room   flashsale.RoomReport  `json:"room"`
				Orders flashsale.OrderReport `json:"orders"`
			}
			r.json(t, &got)
			if got.SaleID != 1 || len(got.Items) != 2 || got.Final {
				t.Errorf("report = %s", r.body)
			}
			if got.Room.Joined != 12 || got.Room.Wait.P99Ms != 1500 || got.Orders.Conversion != 0.25 || len(got.Room.Minutes) != 2 {
				t.Errorf("report figures = %s", r.body)
			}
			if cc := r.header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control = %q", cc)
			}
		}},
		{name: "report csv", method: "GET", path: "/api/admin/sales/1/report?format=csv", headers: op, wantStatus: 200, check: checkReportCSV},
		{name: "report accept csv", method: "GET", path: "/api/admin/sales/1/report", headers: append([]string{"Accept", "text/csv"}, op...), wantStatus: 200, check: checkReportCSV},
		{name: "report json format", method: "GET", path: "/api/admin/sales/1/report?format=json", headers: append([]string{"Accept", "text/csv"}, op...), wantStatus: 200, check: func(t *testing.T, r resp) {
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type = %q", ct)
			}
		}},
		{name: "report unknown", method: "GET", path: "/api/admin/sales/9/report", headers: op, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "report malformed", method: "GET", path: "/api/admin/sales/x/report", headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "report bad format", method: "GET", path: "/api/admin/sales/1/report?format=xml", headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "get malformed", method: "GET", path: "/api/admin/sales/x", headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "patch", method: "PATCH", path: "/api/admin/sales/1", body: `{"admissionRatePerSecond":50,"name":"Renamed","endsAt":"2026-12-02T00:00:00Z"}`, headers: op, wantStatus: 200, check: func(t *testing.T, r resp) {
			var got struct {
				Name                   string `json:"name"`
				AdmissionRatePerSecond int    `json:"admissionRatePerSecond"`
				EndsAt                 string `json:"endsAt"`
			}
			r.json(t, &got)
			if got.Name != "Renamed" || got.AdmissionRatePerSecond != 50 || got.EndsAt != "2026-12-02T00:00:00Z" {
				t.Errorf("patched = %s", r.body)
			}
		}},
		{name: "patch rate zero", method: "PATCH", path: "/api/admin/sales/1", body: `{"admissionRatePerSecond":0}`, headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "patch rate string", method: "PATCH", path: "/api/admin/sales/1", body: `{"admissionRatePerSecond":"5"}`, headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "patch unknown field", method: "PATCH", path: "/api/admin/sales/1", body: `{"startsAt":"2026-12-02T00:00:00Z"}`, headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "patch bad endsAt", method: "PATCH", path: "/api/admin/sales/1", body: `{"endsAt":"tomorrow"}`, headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "patch unknown sale", method: "PATCH", path: "/api/admin/sales/9", body: `{"name":"x"}`, headers: op, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "settings get", method: "GET", path: "/api/admin/settings", headers: op, wantStatus: 200, check: func(t *testing.T, r resp) {
			if string(r.body) != `{"pow":{"difficulty":0}}` {
				t.Errorf("body %s", r.body)
			}
		}},
		{name: "settings put", method: "PUT", path: "/api/admin/settings", body: `{"pow":{"difficulty":3}}`, headers: op, wantStatus: 200, check: func(t *testing.T, r resp) {
			if string(r.body) != `{"pow":{"difficulty":3}}` || e.settings.actors[len(e.settings.actors)-1] != "1" {
				t.Errorf("body %s, actors %v", r.body, e.settings.actors)
			}
		}},
		{name: "settings put invalid for the store", method: "PUT", path: "/api/admin/settings", body: `{"pow":{"difficulty":"hard"}}`, headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "settings put not an object", method: "PUT", path: "/api/admin/settings", body: `[]`, headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "settings put bad JSON", method: "PUT", path: "/api/admin/settings", body: `{"pow":`, headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "preset", method: "POST", path: "/api/admin/settings/preset/strict", headers: op, wantStatus: 200},
		{name: "preset unknown", method: "POST", path: "/api/admin/settings/preset/lenient", headers: op, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "preset bad name", method: "POST", path: "/api/admin/settings/preset/a%20b", headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "audit", method: "GET", path: "/api/admin/audit", headers: op, wantStatus: 200, check: func(t *testing.T, r resp) {
			if string(r.body) != `[{"limit":100}]` {
				t.Errorf("body %s", r.body)
			}
		}},
		{name: "audit limit", method: "GET", path: "/api/admin/audit?limit=5", headers: op, wantStatus: 200},
		{name: "audit bad limit", method: "GET", path: "/api/admin/audit?limit=-5", headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "audit huge limit", method: "GET", path: "/api/admin/audit?limit=5000", headers: op, wantStatus: 400, wantCode: "INVALID"},
		{name: "defense", method: "GET", path: "/api/admin/defense", headers: op, wantStatus: 200, check: func(t *testing.T, r resp) {
			if string(r.body) != `[{"rule":"blocklist","outcome":"blocked","count":1}]` {
				t.Errorf("body %s", r.body)
			}
		}},
	})
}

func TestAdminCreateStockShards(t *testing.T) {
	e := newEnv(t)
	op := []string{"Authorization", bearer(e.token(1, true))}
	r := e.do("POST", "/api/admin/sales", `{"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"stockShards":3,
		"items":[{"productId":501,"quantity":10,"priceCents":1}]}`, op...)
	var got struct {
		StockShards int `json:"stockShards"`
	}
	r.json(t, &got)
	if r.status != 201 || got.StockShards != 3 {
		t.Fatalf("got %d %s; want 201 with stockShards 3", r.status, r.body)
	}
	if s := e.admin.sales[1]; s.StockShards != 3 {
		t.Errorf("stored StockShards = %d, want 3", s.StockShards)
	}
}

func TestAdminCreateValidation(t *testing.T) {
	e := newEnv(t)
	op := []string{"Authorization", bearer(e.token(1, true))}
	item := `{"productId":501,"quantity":10,"priceCents":1999}`
	body := func(fields string) string { return "{" + fields + "}" }
	base := `"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,`
	tests := []struct {
		name, body, field string
	}{
		{"empty body", "", "body"},
		{"not JSON", "name=x", "object"},
		{"array", "[]", "object"},
		{"trailing data", body(base+`"items":[`+item+`]`) + "{}", "JSON"},
		{"no name", body(`"startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"items":[` + item + `]`), "name"},
		{"blank name", body(`"name":"  ","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"items":[` + item + `]`), "name"},
		{"long name", body(`"name":"` + strings.Repeat("n", 201) + `","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"items":[` + item + `]`), "name"},
		{"name wrong type", body(`"name":5,"startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"items":[` + item + `]`), "name"},
		{"no startsAt", body(`"name":"n","admissionRatePerSecond":5,"items":[` + item + `]`), "startsAt"},
		{"bad startsAt", body(`"name":"n","startsAt":"1 Dec 2026","admissionRatePerSecond":5,"items":[` + item + `]`), "startsAt"},
		{"startsAt number", body(`"name":"n","startsAt":1764612000,"admissionRatePerSecond":5,"items":[` + item + `]`), "startsAt"},
		{"bad endsAt", body(base + `"endsAt":"x","items":[` + item + `]`), "endsAt"},
		{"endsAt before start", body(base + `"endsAt":"2026-11-01T18:00:00Z","items":[` + item + `]`), "endsAt"},
		{"no rate", body(`"name":"n","startsAt":"2026-12-01T18:00:00Z","items":[` + item + `]`), "admissionRatePerSecond"},
		{"rate zero", body(`"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":0,"items":[` + item + `]`), "admissionRatePerSecond"},
		{"rate fraction", body(`"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":1.5,"items":[` + item + `]`), "admissionRatePerSecond"},
		{"shards zero", body(base + `"stockShards":0,"items":[` + item + `]`), "stockShards"},
		{"too many shards", body(base + `"stockShards":17,"items":[` + item + `]`), "stockShards"},
		{"shards string", body(base + `"stockShards":"3","items":[` + item + `]`), "stockShards"},
		{"allocation unknown", body(base + `"allocation":"lottery","items":[` + item + `]`), "allocation"},
		{"allocation empty", body(base + `"allocation":"","items":[` + item + `]`), "allocation"},
		{"claim window zero", body(base + `"claimWindowSeconds":0,"items":[` + item + `]`), "claimWindowSeconds"},
		{"claim window short", body(base + `"claimWindowSeconds":9,"items":[` + item + `]`), "claimWindowSeconds"},
		{"claim window long", body(base + `"claimWindowSeconds":3601,"items":[` + item + `]`), "claimWindowSeconds"},
		{"no items", body(base[:len(base)-1]), "items"},
		{"empty items", body(base + `"items":[]`), "items"},
		{"items object", body(base + `"items":{}`), "items"},
		{"quantity zero", body(base + `"items":[{"productId":501,"quantity":0,"priceCents":1}]`), "items[0].quantity"},
		{"quantity missing", body(base + `"items":[` + item + `,{"productId":501,"priceCents":1}]`), "items[1].quantity"},
		{"quantity string", body(base + `"items":[{"productId":501,"quantity":"10","priceCents":1}]`), "quantity"},
		{"quantity overflow", body(base + `"items":[{"productId":501,"quantity":99999999999999999999,"priceCents":1}]`), "quantity"},
		{"negative price", body(base + `"items":[{"productId":501,"quantity":1,"priceCents":-1}]`), "items[0].priceCents"},
		{"no price", body(base + `"items":[{"productId":501,"quantity":1}]`), "items[0].priceCents"},
		{"product zero", body(base + `"items":[{"productId":0,"quantity":1,"priceCents":1}]`), "items[0].productId"},
		{"unknown field", body(base + `"items":[` + item + `],"discount":5`), "discount"},
		{"unknown item field", body(base + `"items":[{"productId":501,"quantity":1,"priceCents":1,"sku":"x"}]`), "sku"},
		{"user id in body", body(base + `"items":[` + item + `],"userId":5`), "userId"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do("POST", "/api/admin/sales", tt.body, op...)
			var got struct{ Error, Message string }
			r.json(t, &got)
			if r.status != 400 || got.Error != "INVALID" || !strings.Contains(got.Message, tt.field) {
				t.Errorf("got %d %s; want 400 INVALID naming %q", r.status, r.body, tt.field)
			}
		})
	}
	if len(e.admin.sales) != 0 {
		t.Errorf("%d sales created from bad bodies", len(e.admin.sales))
	}
}

func TestStaticPages(t *testing.T) {
	e := newEnv(t)
	runCases(t, e, []routeCase{
		{name: "index", method: "GET", path: "/", wantStatus: 200, check: func(t *testing.T, r resp) {
			if string(r.body) != "<html>shop</html>" || r.header.Get("ETag") != `"idx1"` || r.header.Get("Cache-Control") != "public, max-age=60" ||
				r.header.Get("Content-Type") != "text/html; charset=utf-8" || r.header.Get("Content-Encoding") != "" {
				t.Errorf("got %v %s", r.header, r.body)
			}
		}},
		{name: "sale page", method: "GET", path: "/sales/7", wantStatus: 200, check: func(t *testing.T, r resp) {
			if string(r.body) != "<html>shop</html>" {
				t.Errorf("body %s", r.body)
			}
		}},
		{name: "sale page bad id", method: "GET", path: "/sales/abc", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "gzip", method: "GET", path: "/", headers: []string{"Accept-Encoding", "br, gzip;q=0.8"}, wantStatus: 200, check: func(t *testing.T, r resp) {
			if string(r.body) != "GZ" || r.header.Get("Content-Encoding") != "gzip" || r.header.Get("Vary") != "Accept-Encoding" || r.header.Get("ETag") != `"idx1-gz"` {
				t.Errorf("got %v %q", r.header, r.body)
			}
		}},
		{name: "gzip refused", method: "GET", path: "/", headers: []string{"Accept-Encoding", "gzip;q=0"}, wantStatus: 200, check: func(t *testing.T, r resp) {
			if r.header.Get("Content-Encoding") != "" {
				t.Errorf("got %v", r.header)
			}
		}},
		{name: "not modified", method: "GET", path: "/", headers: []string{"If-None-Match", `"old", W/"idx1"`}, wantStatus: 304, check: func(t *testing.T, r resp) {
			if len(r.body) != 0 || r.header.Get("ETag") != `"idx1"` {
				t.Errorf("got %v %q", r.header, r.body)
			}
		}},
		{name: "modified", method: "GET", path: "/", headers: []string{"If-None-Match", `"old"`}, wantStatus: 200},
		{name: "gzip not modified", method: "GET", path: "/", headers: []string{"Accept-Encoding", "gzip", "If-None-Match", `"idx1-gz"`}, wantStatus: 304},
		{name: "gzip tag does not match identity", method: "GET", path: "/", headers: []string{"If-None-Match", `"idx1-gz"`}, wantStatus: 200},
		{name: "operator", method: "GET", path: "/operator", wantStatus: 200, check: func(t *testing.T, r resp) {
			if string(r.body) != "<html>op</html>" {
				t.Errorf("body %s", r.body)
			}
		}},
		{name: "asset", method: "GET", path: "/assets/app.js", wantStatus: 200, check: func(t *testing.T, r resp) {
			if string(r.body) != "js()" || r.header.Get("Content-Type") != "text/javascript" {
				t.Errorf("got %v %s", r.header, r.body)
			}
		}},
		{name: "head asset", method: "HEAD", path: "/assets/app.js", wantStatus: 200},
		{name: "unknown asset", method: "GET", path: "/assets/nope.js", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "traversal", method: "GET", path: "/assets/../main.go", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "encoded traversal", method: "GET", path: "/assets/%2e%2e/x", wantStatus: 404, wantCode: "NOT_FOUND"},
	})
	e2 := newEnv(t, func(_ *Config, d *Deps) { d.Static = nil })
	if r := e2.do("GET", "/", ""); r.status != 404 || r.errCode() != "NOT_FOUND" {
		t.Errorf("no static files: %d %s", r.status, r.body)
	}
}

func TestUnknownRoutesAndCORS(t *testing.T) {
	e := newEnv(t)
	runCases(t, e, []routeCase{
		{name: "unknown path", method: "GET", path: "/api/nope", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "wrong method", method: "DELETE", path: "/api/admin/sales", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "GET on purchase", method: "GET", path: "/api/flash-sales/items/101/purchase", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "preflight without CORS", method: "OPTIONS", path: "/api/flash-sales/items/101/purchase", headers: []string{"Origin", "https://cdn.example", "Access-Control-Request-Method", "POST"}, wantStatus: 404, check: func(t *testing.T, r resp) {
			if r.header.Get("Access-Control-Allow-Origin") != "" {
				t.Error("CORS allowed without configuration")
			}
		}},
	})

	c := newEnv(t, func(cfg *Config, _ *Deps) { cfg.CORSOrigins = []string{"https://cdn.example"} })
	runCases(t, c, []routeCase{
		{name: "preflight", method: "OPTIONS", path: "/api/flash-sales/items/101/purchase", headers: []string{"Origin", "https://cdn.example", "Access-Control-Request-Method", "POST"}, wantStatus: 204, check: func(t *testing.T, r resp) {
			if r.header.Get("Access-Control-Allow-Origin") != "https://cdn.example" ||
				!strings.Contains(r.header.Get("Access-Control-Allow-Headers"), "X-Admission-Token") ||
				!strings.Contains(r.header.Get("Access-Control-Allow-Headers"), "Authorization") {
				t.Errorf("headers %v", r.header)
			}
		}},
		{name: "preflight other origin", method: "OPTIONS", path: "/api/flash-sales/items/101/purchase", headers: []string{"Origin", "https://evil.example", "Access-Control-Request-Method", "POST"}, wantStatus: 404, check: func(t *testing.T, r resp) {
			if r.header.Get("Access-Control-Allow-Origin") != "" {
				t.Error("foreign origin allowed")
			}
		}},
		{name: "simple request", method: "GET", path: "/api/flash-sales/sales/1", headers: []string{"Origin", "https://cdn.example"}, wantStatus: 200, check: func(t *testing.T, r resp) {
			if r.header.Get("Access-Control-Allow-Origin") != "https://cdn.example" || r.header.Get("Access-Control-Expose-Headers") != "Retry-After, ETag" {
				t.Errorf("headers %v", r.header)
			}
		}},
	})
}

func TestStatusMapping(t *testing.T) {
	tests := []struct {
		code flashsale.Code
		want int
	}{
		{flashsale.CodeInvalid, 400}, {flashsale.CodeUnauthenticated, 401}, {flashsale.CodeForbidden, 403},
		{flashsale.CodeNotAdmitted, 403}, {flashsale.CodeBlocked, 403}, {flashsale.CodeNotFound, 404},
		{flashsale.CodeAlreadyPurchased, 409}, {flashsale.CodeOrderExpired, 409}, {flashsale.CodeOrderCancelled, 409},
		{flashsale.CodeNotPayableYet, 409}, {flashsale.CodeOrderPaid, 409}, {flashsale.CodeSoldOut, 410},
		{flashsale.CodeTooLarge, 413}, {flashsale.CodeRateLimited, 429}, {flashsale.CodeUnavailable, 503},
		{flashsale.CodeInternal, 500}, {"SOMETHING_NEW", 500},
		{flashsale.CodeBadSignature, 401}, {flashsale.CodeStaleSignature, 401}, {flashsale.CodeReplayed, 409},
	}
	for _, tt := range tests {
		if got := statusOf(tt.code); got != tt.want {
			t.Errorf("statusOf(%s) = %d, want %d", tt.code, got, tt.want)
		}
	}
	if got := retryAfterSeconds(0); got != 1 {
		t.Errorf("retryAfterSeconds(0) = %d", got)
	}
	if got := retryAfterSeconds(1001 * time.Millisecond); got != 2 {
		t.Errorf("retryAfterSeconds(1.001s) = %d", got)
	}
}

// TestGuardClasses shows which Guard class each route is checked under, and
// that a blocked address is refused on every API route.
func TestGuardClasses(t *testing.T) {
	e := newEnv(t)
	user := bearer(e.token(7, false))
	op := bearer(e.token(1, true))
	tests := []struct {
		method, path, auth, class string
	}{
		{"POST", "/api/flash-sales/items/101/purchase", user, ClassPurchase},
		{"POST", "/api/flash-sales/sales/1/queue", user, ClassJoin},
		{"GET", "/api/flash-sales/sales/1/queue", user, ClassRead},
		{"GET", "/api/flash-sales/sales/1", "", ClassRead},
		{"GET", "/api/flash-sales/sales/1/draw", "", ClassDraw},
		{"GET", "/api/flash-sales/sales", "", ClassRead},
		{"GET", "/api/flash-sales/sales/1/order", user, ClassRead},
		{"GET", "/api/flash-sales/orders/" + orderA, user, ClassRead},
		{"POST", "/api/flash-sales/orders/" + orderA + "/pay", user, ClassRead},
		{"POST", "/api/flash-sales/orders/" + orderA + "/cancel", user, ClassRead},
		{"GET", "/api/admin/sales", op, ClassAdmin},
		{"GET", "/api/admin/settings", op, ClassAdmin},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			e.guard.lastClass.Store("")
			e.do(tt.method, tt.path, "", "Authorization", tt.auth)
			if got := e.guard.lastClass.Load(); got != tt.class {
				t.Errorf("class = %q, want %q", got, tt.class)
			}
			before := e.access.calls.Load()
			r := e.do(tt.method, tt.path, "", "Authorization", tt.auth, "X-Forwarded-For", "203.0.113.5")
			if r.status != 403 || r.errCode() != "BLOCKED" {
				t.Errorf("blocked address: %d %s", r.status, r.body)
			}
			if e.access.calls.Load() != before {
				t.Error("blocked address reached token verification")
			}
		})
	}
	t.Run("static pages are not checked", func(t *testing.T) {
		if r := e.do("GET", "/", "", "X-Forwarded-For", "203.0.113.5"); r.status != 200 {
			t.Errorf("status %d", r.status)
		}
	})
	t.Run("every X-Forwarded-For header reaches the Guard", func(t *testing.T) {
		req := "GET /api/flash-sales/sales/1 HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 192.0.2.2, 192.0.2.3\r\n\r\n"
		addr := serve(t, e)
		raw(t, addr, req)
		if got := e.guard.lastXFF.Load(); got != "192.0.2.1,192.0.2.2, 192.0.2.3" {
			t.Errorf("xff = %q", got)
		}
	})
}

// A sale's allocation and claim window are taken at creation and shown;
// race order named, with the default window. (The default allocation,
// queue, is the store's: sales.TestCreateGetUpdateFigures.)
func TestAdminCreateAllocation(t *testing.T) {
	e := newEnv(t)
	op := []string{"Authorization", bearer(e.token(1, true))}
	var got struct {
		ID                 int64  `json:"id"`
		Allocation         string `json:"allocation"`
		ClaimWindowSeconds int    `json:"claimWindowSeconds"`
	}
	r := e.do("POST", "/api/admin/sales", `{"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"allocation":"queue",
		"claimWindowSeconds":30,"items":[{"productId":501,"quantity":10,"priceCents":1}]}`, op...)
	r.json(t, &got)
	if r.status != 201 || got.Allocation != "queue" || got.ClaimWindowSeconds != 30 {
		t.Fatalf("got %d %s; want 201 in queue order with a 30 s window", r.status, r.body)
	}
	if s := e.admin.sales[got.ID]; !s.QueueOrder() || s.ClaimWindow != 30*time.Second {
		t.Errorf("stored %q %v, want queue order and 30s", s.Allocation, s.ClaimWindow)
	}
	r = e.do("POST", "/api/admin/sales", `{"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"allocation":"race",
		"items":[{"productId":501,"quantity":10,"priceCents":1}]}`, op...)
	r.json(t, &got)
	if r.status != 201 || got.Allocation != "race" || got.ClaimWindowSeconds != 120 {
		t.Fatalf("got %d %s; want 201 in race order with the default window", r.status, r.body)
	}
}

// checkReportCSV checks the fake report as CSV: the header, then one row
// per minute of the room or the orders, the room's totals carried into
// the orders' last minute.
func checkReportCSV(t *testing.T, r resp) {
	t.Helper()
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/csv") {
		t.Errorf("Content-Type = %q", ct)
	}
	if cd := r.header.Get("Content-Disposition"); cd != `attachment; filename="sale-1-report.csv"` {
		t.Errorf("Content-Disposition = %q", cd)
	}
	want := "minute,joins,joined,pre_queue,admissions,admitted,holds,waiting,refusals,shadowed,wait_count,wait_p50_ms,wait_p90_ms,wait_p99_ms,sold,paid,sold_item_1001,sold_item_1002\n" +
		"2026-12-01T18:30:00Z,10,10,10,5,5,0,5,2,3,5,250,500,500,0,0,0,0\n" +
		"2026-12-01T18:31:00Z,2,12,10,4,9,0,3,0,0,4,1000,1500,1500,4,0,4,0\n" +
		"2026-12-01T18:32:00Z,0,12,10,0,9,0,3,0,0,0,0,0,0,0,1,0,0\n"
	if got := string(r.body); got != want {
		t.Errorf("csv =\n%s\nwant\n%s", got, want)
	}
}
