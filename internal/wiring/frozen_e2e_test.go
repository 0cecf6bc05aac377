package wiring_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
)

// TestPurchaseDuringRedisFreeze: a purchase whose reservation a frozen
// redis-server (SIGSTOP) does not answer is 503 with its order's id and
// Retry-After, not "nothing reserved". Once Redis wakes, the gateway
// settles it within seconds: the order the shopper's retry gets (202) is
// the one their lookup finds PENDING and payable (in the database, where
// the reconciler no longer rejects it); an uncertain order that never ran
// is unknown (404). A shopper who does not retry finds their order the
// same way. (Before, the reservation ran at SIGCONT, the retry was told
// ALREADY_PURCHASED, and the reconciler rejected the order later.)
func TestPurchaseDuringRedisFreeze(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	srv := testenv.NewRedisServer(t)
	t.Cleanup(func() { _ = srv.Signal(syscall.SIGCONT) })
	s := startStack(t, func(c *wiring.Config) {
		c.RedisURL, c.RedisCluster = srv.URL, nil
	})
	saleID, items := s.createSale(5)
	tokens := map[int64]string{}
	for _, u := range []int64{11, 12} {
		tokens[u] = s.admit(u, saleID)
	}

	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	uncertain := map[int64]string{}
	for _, u := range []int64{11, 12} {
		r := s.purchase(u, items[0], tokens[u])
		id, _ := r.Body["orderId"].(string)
		if r.Status != 503 || r.Body["error"] != "UNAVAILABLE" || id == "" || r.Header.Get("Retry-After") == "" {
			t.Fatalf("user %d, purchase with Redis frozen: %d %v (Retry-After %q); want 503 UNAVAILABLE naming the order", u, r.Status, r.Body, r.Header.Get("Retry-After"))
		}
		uncertain[u] = id
	}
	if err := srv.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if n := outcomes(t, s, "reserve_uncertain"); n != 2 {
		t.Errorf("%v reservations counted uncertain, want 2", n)
	}

	// User 11 retries: 202 with the uncertain order if its reservation ran,
	// or a new one if it never did; never ALREADY_PURCHASED.
	var retried string
	testenv.EventuallyF(t, func() string { return "user 11's retry answered 202" }, 10*time.Second, func() bool {
		r := s.purchase(11, items[0], tokens[11])
		if r.Status == 409 {
			t.Fatalf("retry after the freeze: 409 %v; want 202", r.Body)
		}
		retried, _ = r.Body["orderId"].(string)
		return r.Status == 202
	})
	orders := map[int64]string{11: retried}
	// User 12 does not retry: the sale's order lookup names its order
	// once settled, or none (404) when the reservation never ran.
	testenv.EventuallyF(t, func() string { return "user 12's uncertain order settled" }, 10*time.Second, func() bool {
		r := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), s.Token(12, false), nil)
		if r.Status == 200 {
			orders[12], _ = r.Body["orderId"].(string)
			return true
		}
		return r.Status == 404 && outcomes(t, s, "uncertain_none") > 0
	})
	t.Logf("uncertain orders %v; settled as %v (the same id: the reservation ran at SIGCONT)", uncertain, orders)
	for u, id := range orders {
		if id != "" && id != uncertain[u] && u == 12 {
			t.Errorf("user 12's order %s, want the uncertain %s or none", id, uncertain[u])
		}
		if id != uncertain[u] {
			// The reservation never ran: its id is unknown.
			s.Want(s.Do("GET", "/api/flash-sales/orders/"+uncertain[u], s.Token(u, false), nil), 404, "NOT_FOUND")
		}
		if id == "" {
			continue
		}
		if r := s.waitPayable(u, id); r.Body["status"] != "PENDING" {
			t.Errorf("user %d's order %s: %v; want PENDING", u, id, r.Body)
		}
	}
}

// outcomes reads flashsale_purchase_reservations_total{outcome} of the
// stack's gateway.
func outcomes(t *testing.T, s *stack, outcome string) float64 {
	t.Helper()
	mfs, err := s.App.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "flashsale_purchase_reservations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
