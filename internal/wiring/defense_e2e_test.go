package wiring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale/defense"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// twoGateways starts two whole stacks on the same Redis, PostgreSQL and
// Kafka: two gateway processes of one deployment.
func twoGateways(t *testing.T) (*stack, *stack) {
	t.Helper()
	var shared wiring.Config
	a := startStack(t, func(c *wiring.Config) { shared = *c })
	b := startStack(t, func(c *wiring.Config) {
		c.RedisURL, c.DatabaseURL, c.KafkaBrokers = shared.RedisURL, shared.DatabaseURL, shared.KafkaBrokers
	})
	return a, b
}

// wsJoin opens the waiting room and returns the first message's type and
// error code.
func wsJoin(t *testing.T, s *stack, saleID int64, token string) (typ, code string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := strings.Replace(s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	c, hresp, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		if hresp != nil && hresp.StatusCode == http.StatusForbidden {
			return "http", "BLOCKED"
		}
		t.Fatalf("dial: %v", err)
	}
	defer c.CloseNow()
	msg, _ := json.Marshal(map[string]string{"type": "join", "accessToken": token})
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		t.Fatal(err)
	}
	_, data, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	var m struct{ Type, Error string }
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("bad message %s: %v", data, err)
	}
	return m.Type, m.Error
}

func putSettings(t *testing.T, s *stack, body string) {
	t.Helper()
	r := s.Do("PUT", "/api/admin/settings", s.Token(1, true), body)
	s.Want(r, 200, "")
}

func TestBlocklistReachesBothGatewaysWithin2s(t *testing.T) {
	a, b := twoGateways(t)
	saleID, items := a.createSale(10)
	b.waitSale(saleID)
	blocked := int64(4242)
	for _, s := range []*stack{a, b} {
		if typ, _ := wsJoin(t, s, saleID, s.Token(blocked, false)); typ != "status" {
			t.Fatalf("before blocking, join answered %q, want status", typ)
		}
	}
	putSettings(t, a, `{"rateLimit": {"perIp": {"rps": 100000, "burst": 100000}, "perUser": {"rps": 100000, "burst": 100000}},
		"pow": {"difficulty": 0}, "blocklist": {"cidrs": [], "users": ["4242"]}}`)
	applied := time.Now()
	purchase := fmt.Sprintf("/api/flash-sales/items/%d/purchase", items[0])
	for _, s := range []*stack{b, a} {
		var r apptest.Resp
		testenv.EventuallyF(t, func() string {
			return fmt.Sprintf("gateway %s to block the user within 2s of the change (last %d %s)", s.App.PublicURL, r.Status, r.Raw)
		}, time.Until(applied.Add(2*time.Second)), func() bool {
			r = s.Do("POST", purchase, s.Token(blocked, false), nil, "X-Admission-Token", "x")
			return r.Status == 403 && r.Body["error"] == "BLOCKED"
		})
		if typ, code := wsJoin(t, s, saleID, s.Token(blocked, false)); code != "BLOCKED" {
			t.Fatalf("gateway %s: WebSocket join answered %s/%s, want BLOCKED", s.App.PublicURL, typ, code)
		}
		s.Want(s.Do("POST", fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID), s.Token(blocked, false), nil), 403, "BLOCKED")
		s.Want(s.Do("GET", "/api/flash-sales/orders/8d3f8a4e-4f0b-4c43-9a57-4d7f3f0c2b11", s.Token(blocked, false), nil), 403, "BLOCKED")
		// Others are still served.
		if typ, _ := wsJoin(t, s, saleID, s.Token(77, false)); typ != "status" {
			t.Fatalf("an unblocked user got %q", typ)
		}
	}

	// A CIDR covering loopback blocks every request of this test's address,
	// on both gateways, before any token is looked at.
	putSettings(t, a, `{"rateLimit": {"perIp": {"rps": 100000, "burst": 100000}, "perUser": {"rps": 100000, "burst": 100000}},
		"pow": {"difficulty": 0}, "blocklist": {"cidrs": ["127.0.0.0/8"], "users": []}}`)
	applied = time.Now()
	for _, s := range []*stack{a, b} {
		var r apptest.Resp
		testenv.EventuallyF(t, func() string {
			return fmt.Sprintf("gateway %s to block the CIDR within 2s of the change (last %d %s)", s.App.PublicURL, r.Status, r.Raw)
		}, time.Until(applied.Add(2*time.Second)), func() bool {
			r = s.Do("POST", purchase, "", nil)
			return r.Status == 403 && r.Body["error"] == "BLOCKED"
		})
		if _, code := wsJoin(t, s, saleID, s.Token(77, false)); code != "BLOCKED" {
			t.Fatalf("gateway %s: WebSocket join from a blocked CIDR: %s, want BLOCKED", s.App.PublicURL, code)
		}
	}
	// Unblock through the other gateway's store directly (the API is blocked
	// for this address now) and check it is served again.
	if err := b.App.SetDefense(context.Background(), "test", []byte(apptest.Permissive)); err != nil {
		t.Fatal(err)
	}
	var r apptest.Resp
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("the unblock within 2s (last %d %s)", r.Status, r.Raw) }, 2*time.Second, func() bool {
		r = a.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d", saleID), "", nil)
		return r.Status == 200
	})
}

func TestShadowModeChangesNoResponseButCounts(t *testing.T) {
	s := startStack(t)
	saleID, _ := s.createSale(1)
	shadowed := `{"rateLimit": {"perIp": {"rps": 100000, "burst": 100000}, "perUser": {"rps": 0.001, "burst": 1}},
		"pow": {"difficulty": 0}, "blocklist": {"cidrs": [], "users": ["555"]},
		"shadow": {"perUser": true, "blocklist": true}}`
	if err := s.App.SetDefense(context.Background(), "test", []byte(shadowed)); err != nil {
		t.Fatal(err)
	}
	before := shadowCount(t, s)
	path := fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID)
	for i := 0; i < 5; i++ {
		// A blocked user over its per-user limit: both rules only count.
		s.Want(s.Do("GET", path, s.Token(555, false), nil), 404, "NOT_FOUND")
	}
	if got := shadowCount(t, s) - before; got < 5 {
		t.Fatalf("shadow outcomes counted = %d, want at least 5 (5 blocked + 4 limited)", got)
	}
	// Out of shadow, the same requests are refused.
	enforced := strings.Replace(shadowed, `"shadow": {"perUser": true, "blocklist": true}`, `"shadow": {}`, 1)
	if err := s.App.SetDefense(context.Background(), "test", []byte(enforced)); err != nil {
		t.Fatal(err)
	}
	s.Want(s.Do("GET", path, s.Token(555, false), nil), 403, "BLOCKED")
}

func shadowCount(t *testing.T, s *stack) uint64 {
	t.Helper()
	r := s.Do("GET", "/api/admin/defense", s.Token(1, true), nil)
	s.Want(r, 200, "")
	var body struct{ Counters []defense.Counter }
	var list []defense.Counter
	if err := json.Unmarshal(r.Raw, &list); err != nil {
		if err := json.Unmarshal(r.Raw, &body); err != nil {
			t.Fatalf("defense counters: %s", r.Raw)
		}
		list = body.Counters
	}
	var n uint64
	for _, c := range list {
		if c.Outcome == defense.OutcomeShadow {
			n += c.Count
		}
	}
	return n
}

// TestBlockingClosesOpenWaitingRoomConnections: a shopper already in the
// waiting room when an operator blocks them is told BLOCKED and
// disconnected, on the next tick.
func TestBlockingClosesOpenWaitingRoomConnections(t *testing.T) {
	s := startStack(t)
	saleID, _ := s.createSale(10)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	url := strings.Replace(s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	msg, _ := json.Marshal(map[string]string{"type": "join", "accessToken": s.Token(4343, false)})
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		t.Fatal(err)
	}
	if _, data, err := c.Read(ctx); err != nil || !strings.Contains(string(data), `"status"`) {
		t.Fatalf("first message %s, %v", data, err)
	}
	blocked := strings.Replace(apptest.Permissive, `"users": []`, `"users": ["4343"]`, 1)
	if err := s.App.SetDefense(ctx, "test", []byte(blocked)); err != nil {
		t.Fatal(err)
	}
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
				t.Fatalf("closed with %v, want 1008 after a BLOCKED message", err)
			}
			t.Fatal("closed without a BLOCKED message")
		}
		var m struct{ Type, Error string }
		_ = json.Unmarshal(data, &m)
		if m.Type == "error" {
			if m.Error != "BLOCKED" {
				t.Fatalf("error %s, want BLOCKED", data)
			}
			break
		}
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("after BLOCKED: %v, want close 1008", err)
	}
}

// TestWSConnsPerAddrConfigured: FLASHSALE_WS_MAX_CONNS_PER_ADDR reaches the
// gateway's waiting room: with a cap of 2, the third room connection from
// one address is refused with 429 while the first two stay open.
func TestWSConnsPerAddrConfigured(t *testing.T) {
	s := startStack(t, func(c *wiring.Config) { c.WSMaxConnsPerAddr = 2 })
	saleID, _ := s.createSale(10)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	url := strings.Replace(s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	for i := range 2 {
		c, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
		defer c.CloseNow()
	}
	c, hresp, err := websocket.Dial(ctx, url, nil)
	if err == nil {
		c.CloseNow()
		t.Fatal("third connection from one address accepted with a cap of 2")
	}
	if hresp == nil || hresp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third connection: %v (response %v), want 429", err, hresp)
	}
}
