package wiring_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// admissionFor signs an admission token as the waiting room would at the
// user's turn (the waiting room's own tests cover how turns come).
func (s *stack) admissionFor(user, saleID int64) string {
	return s.App.SignAdmission(user, saleID, time.Minute)
}

// TestContentionThroughHTTP is the article's contention test through the
// real interface: 1,000 concurrent shoppers for 100 units.
func TestContentionThroughHTTP(t *testing.T) {
	s := startStack(t)
	s.Client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 128, MaxIdleConnsPerHost: 128}}
	saleID, items := s.createSale(100)
	item := items[0]
	const users = 1000
	type result struct {
		user    int64
		status  int
		orderID string
	}
	results := make(chan result, users)
	var wg sync.WaitGroup
	for u := int64(1); u <= users; u++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.purchase(10_000+u, item, s.admissionFor(10_000+u, saleID))
			id, _ := r.Body["orderId"].(string)
			results <- result{user: 10_000 + u, status: r.Status, orderID: id}
		}()
	}
	wg.Wait()
	close(results)
	byStatus := map[int]int{}
	var winner result
	orders := map[string]bool{}
	for r := range results {
		byStatus[r.status]++
		if r.status == 202 {
			winner = r
			if orders[r.orderID] {
				t.Fatalf("order id %s handed out twice", r.orderID)
			}
			orders[r.orderID] = true
		}
	}
	if byStatus[202] != 100 || byStatus[410] != users-100 {
		t.Fatalf("outcomes %v, want 100×202 and %d×410", byStatus, users-100)
	}
	// A winner's second try: the item is sold out now, so the contract lets
	// the gateway's sold-out flag answer 410 before any lookup; 409 must name
	// the winner's order. Either way the winner finds the order.
	again := s.purchase(winner.user, item, s.admissionFor(winner.user, saleID))
	switch {
	case again.Status == 410 && again.Body["error"] == "SOLD_OUT":
	case again.Status == 409 && again.Body["error"] == "ALREADY_PURCHASED" && again.Body["orderId"] == winner.orderID:
	default:
		t.Fatalf("winner's second try: %d %s", again.Status, again.Raw)
	}
	mine := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), s.Token(winner.user, false), nil)
	s.Want(mine, 200, "")
	if mine.Body["orderId"] != winner.orderID {
		t.Fatalf("winner's order lookup = %s, want %s", mine.Raw, winner.orderID)
	}
	// Once the writer is through: 100 live orders in PostgreSQL, stock 0.
	var sold int64
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("100 sold in PostgreSQL (%d now)", sold) }, 20*time.Second, func() bool {
		fig := s.figures(saleID)
		rem := itemFigure(t, fig, item, "remaining")
		if sold = itemFigure(t, fig, item, "sold"); rem != 0 || sold > 100 {
			t.Fatalf("sold = %d in PostgreSQL, remaining = %d; want 100 and 0", sold, rem)
		}
		return sold == 100
	})
}

// TestOnePurchasePerSaleThroughHTTP: with two items in one sale, a shopper
// gets one of them, not both.
func TestOnePurchasePerSaleThroughHTTP(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale(50, 50)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	for u := int64(1); u <= 40; u++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := 20_000 + u
			at := s.admissionFor(user, saleID)
			// Both items at once, in opposite orders for odd and even users.
			a, b := items[0], items[1]
			if u%2 == 1 {
				a, b = b, a
			}
			var inner sync.WaitGroup
			codes := make([]string, 2)
			for i, it := range []int64{a, b} {
				inner.Add(1)
				go func() {
					defer inner.Done()
					r := s.purchase(user, it, at)
					codes[i] = fmt.Sprint(r.Status)
				}()
			}
			inner.Wait()
			mu.Lock()
			got[codes[0]+"+"+codes[1]]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if got["202+409"]+got["409+202"] != 40 {
		t.Fatalf("outcomes per user %v, want one 202 and one 409 each", got)
	}
	fig := s.figures(saleID)
	if r0, r1 := itemFigure(t, fig, items[0], "remaining"), itemFigure(t, fig, items[1], "remaining"); r0+r1 != 60 {
		t.Fatalf("remaining %d + %d, want 60 in all", r0, r1)
	}
}
