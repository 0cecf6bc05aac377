package wiring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/lua"
	"github.com/flashsale/flashsale/push"
	"github.com/flashsale/flashsale/push/pushtest"
)

// pushStack is a stack with turn notifications on, and a local push
// service on 127.0.0.1 that decrypts them (the only host allowed over
// http).
func pushStack(t *testing.T) (*apptest.Stack, *specCheck, *pushtest.Service) {
	t.Helper()
	pub, priv, err := push.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	svc := pushtest.New(t, pub)
	s := apptest.Start(t, func(c *wiring.Config) {
		c.PushPublicKey, c.PushPrivateKey, c.PushSubject = pub, priv, "mailto:ops@shop.example"
		c.PushInsecureHosts = "127.0.0.1"
	})
	return s, newSpecCheck(t, s), svc
}

// saleOpeningSoon creates a sale that opens in four seconds, so shoppers
// subscribe and join before anyone is admitted (a subscription that came
// after the turn would rightly get nothing).
func saleOpeningSoon(t *testing.T, c *specCheck, allocation string, quantity int) int64 {
	t.Helper()
	body := map[string]any{
		"name": "push", "startsAt": time.Now().Add(4 * time.Second).UTC().Format(time.RFC3339Nano),
		"admissionRatePerSecond": 10000, "allocation": allocation,
		"items": []map[string]any{{"productId": 501, "quantity": quantity, "priceCents": 1999}},
	}
	if allocation == "queue" {
		body["claimWindowSeconds"] = 600
	}
	r := c.call(false, "POST", "/api/admin/sales", c.s.Token(1, true), body)
	c.s.Want(r, 201, "")
	return int64(r.Body["id"].(float64))
}

// subscribeAndJoin subscribes the user at the service's path (when not
// empty), then joins the sale's queue by polling.
func subscribeAndJoin(c *specCheck, svc *pushtest.Service, saleID, user int64, path string) {
	c.t.Helper()
	tok := c.s.Token(user, false)
	if path != "" {
		r := c.call(false, "PUT", fmt.Sprintf("/api/flash-sales/sales/%d/push", saleID), tok, json.RawMessage(svc.Subscribe(path)))
		c.s.Want(r, 204, "")
	}
	c.s.Want(c.call(false, "POST", fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID), tok, nil), 200, "")
}

// notices reads n notifications and returns them by path.
func notices(t *testing.T, svc *pushtest.Service, n int) map[string]push.Notice {
	t.Helper()
	out := map[string]push.Notice{}
	for range n {
		select {
		case got := <-svc.Received:
			var p push.Notice
			if err := json.Unmarshal(got.Payload, &p); err != nil {
				t.Fatalf("payload %q: %v", got.Payload, err)
			}
			if _, dup := out[got.Path]; dup {
				t.Fatalf("a second notification to %s", got.Path)
			}
			out[got.Path] = p
		case <-time.After(30 * time.Second): // guards against a hang only
			t.Fatalf("%d of %d notifications; the service refused: %v", len(out), n, svc.Err())
		}
	}
	return out
}

func storedSubscription(t *testing.T, s *apptest.Stack, saleID, user int64) bool {
	t.Helper()
	rdb, err := redisconn.New(redisconn.Config{URL: s.Config.RedisURL, Cluster: s.Config.RedisCluster})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ok, err := rdb.HExists(context.Background(), lua.PushKey(saleID), fmt.Sprint(user)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestPushAtTurnRaceOrder: the cursor passing a subscribed shopper's
// place sends one notification that opens the sale page, decrypted by a
// local push service; an endpoint answering 410 loses its subscription; a
// shopper who did not subscribe gets nothing; bad subscriptions are
// refused with the contract's codes and keep nothing.
func TestPushAtTurnRaceOrder(t *testing.T) {
	s, c, svc := pushStack(t)
	key := c.call(false, "GET", "/api/flash-sales/push", "", nil)
	s.Want(key, 200, "")
	if key.Body["publicKey"] != s.Config.PushPublicKey {
		t.Fatalf("publicKey = %v, want the configured key", key.Body["publicKey"])
	}
	saleID := saleOpeningSoon(t, c, "race", 10)
	path := fmt.Sprintf("/api/flash-sales/sales/%d/push", saleID)

	// Bad input: the contract's codes, nothing kept.
	tok := s.Token(19, false)
	good := svc.Subscribe("/u/19")
	var sub map[string]any
	_ = json.Unmarshal(good, &sub)
	withEndpoint := func(e string) map[string]any {
		m := map[string]any{"endpoint": e, "keys": sub["keys"]}
		return m
	}
	for _, tc := range []struct {
		name, bearer, path string
		body               any
		status             int
		code               string
	}{
		{"http to a host not allowed", tok, path, withEndpoint("http://push.example/x"), 400, "INVALID"},
		{"private address", tok, path, withEndpoint("https://10.0.0.1/x"), 400, "INVALID"},
		{"bad keys", tok, path, map[string]any{"endpoint": "https://push.example/x", "keys": map[string]string{"p256dh": "AAAA", "auth": "AAAA"}}, 400, "INVALID"},
		{"unknown field", tok, path, map[string]any{"endpoint": "https://push.example/x", "keys": sub["keys"], "extra": 1}, 400, "INVALID"},
		{"too large", tok, path, withEndpoint("https://push.example/" + strings.Repeat("a", 5000)), 413, "TOO_LARGE"},
		{"no token", "", path, json.RawMessage(good), 401, "UNAUTHENTICATED"},
		{"no such sale", tok, "/api/flash-sales/sales/987654/push", json.RawMessage(good), 404, "NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.s.Want(c.callInvalid("PUT", tc.path, tc.bearer, tc.body), tc.status, tc.code)
		})
	}
	if storedSubscription(t, s, saleID, 19) {
		t.Fatal("a refused subscription was kept")
	}
	c.s.Want(c.call(false, "PUT", path, tok, json.RawMessage(good)), 204, "")
	c.s.Want(c.call(false, "DELETE", path, tok, nil), 204, "")
	if storedSubscription(t, s, saleID, 19) {
		t.Fatal("a subscription was kept after DELETE")
	}

	// 11 subscribed, 12's push service forgot it (410), 13 did not
	// subscribe; all three join before the opening.
	svc.Answer("/gone", 410)
	subscribeAndJoin(c, svc, saleID, 11, "/u/11")
	subscribeAndJoin(c, svc, saleID, 12, "/gone")
	subscribeAndJoin(c, svc, saleID, 13, "")
	got := notices(t, svc, 1)
	want := push.Notice{Type: "admitted", SaleID: saleID, URL: fmt.Sprintf("/sales/%d", saleID)}
	if got["/u/11"] != want {
		t.Fatalf("notices = %+v, want %+v at /u/11", got, want)
	}
	waitFor(t, "the 410 subscription dropped", func() bool { return !storedSubscription(t, s, saleID, 12) })
	if !storedSubscription(t, s, saleID, 11) {
		t.Error("a delivered subscription was dropped")
	}

	// A later shopper is told at its own turn; nobody is told twice.
	subscribeAndJoin(c, svc, saleID, 14, "/u/14")
	if got := notices(t, svc, 1); got["/u/14"] != want {
		t.Fatalf("notices = %+v, want one at /u/14", got)
	}
	for p, n := range map[string]int{"/u/11": 1, "/gone": 1, "/u/14": 1} {
		if got := svc.Requests(p); got != n {
			t.Errorf("requests to %s = %d, want %d", p, got, n)
		}
	}
	if err := svc.Err(); err != nil {
		t.Errorf("the push service refused requests: %v", err)
	}
}

// TestPushAtTurnQueueOrder: in queue order the notice goes with the unit
// held for the shopper, and not to a shopper no unit is held for.
func TestPushAtTurnQueueOrder(t *testing.T) {
	s, c, svc := pushStack(t)
	saleID := saleOpeningSoon(t, c, "queue", 2)
	subscribeAndJoin(c, svc, saleID, 21, "/u/21")
	subscribeAndJoin(c, svc, saleID, 22, "/u/22")
	subscribeAndJoin(c, svc, saleID, 23, "/u/23")
	got := notices(t, svc, 2)
	// Two units: the two first places of the draw are held and told.
	var told []string
	for p := range got {
		told = append(told, p)
	}
	admitted := 0
	for _, u := range []int64{21, 22, 23} {
		r := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID), s.Token(u, false), nil)
		s.Want(r, 200, "")
		_, notified := got[fmt.Sprintf("/u/%d", u)]
		if at, _ := r.Body["admissionToken"].(string); (at != "") != notified {
			t.Errorf("user %d: admitted %v, notified %v", u, at != "", notified)
		}
		if notified {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("notified %v, want the two held places", told)
	}
	if err := svc.Err(); err != nil {
		t.Errorf("the push service refused requests: %v", err)
	}
}
