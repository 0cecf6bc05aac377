package wiring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
)

// returnShopper is a shopper of TestReturnedUnitsReachTheQueue, played as
// a page does: it buys when admitted, and after a SOLD_OUT (a 410 or the
// room's state) buys again once the room says the sale is back.
type returnShopper struct {
	user int64

	mu        sync.Mutex
	token     string
	state     string
	bought    []string // order ids
	cancelled bool     // gave its unit back: buys no more
	gaveUp    bool     // admitted, then told SOLD_OUT: buys no more
	itemOut   bool     // the item is sold out: a 410, or the room's soldOutItems
	roomOut   bool     // the room's soldOutItems lists the item
	notBefore time.Time
	answers   map[string]int
	soldOut   int // SOLD_OUT states seen
}

// TestReturnedUnitsReachTheQueue: a sale of 100 units sells out to a
// crowd of 300 in the room; then buyers cancel. Every returned unit is
// sold again to a shopper who had none.
//
// In race order (200 admitted: the capacity factor is 2) every shopper the
// room told SOLD_OUT is told the sale is back. When the admitted shoppers
// who lost have given up (they stay on the page but buy no more), the
// units reach the shoppers who were still waiting: an admitted place stops
// counting against the capacity cap once the shopper was told SOLD_OUT.
//
// In queue order the first 100 places hold the units and buy; everyone
// else is told SOLD_OUT. Each returned unit is held at once for the next
// place in line, whose shopper, told SOLD_OUT before, is admitted and
// buys; the places behind them stay told SOLD_OUT (no unit is free for
// them at any moment).
func TestReturnedUnitsReachTheQueue(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	for _, tc := range []struct {
		name       string
		allocation string
		returned   int
		giveUp     bool
	}{
		{"all back, losers buy again", "race", 100, false},
		{"30 back, admitted losers gave up", "race", 30, true},
		{"queue order, all back to the next in line", "queue", 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) { testReturnedUnits(t, tc.allocation, tc.returned, tc.giveUp) })
	}
}

func testReturnedUnits(t *testing.T, allocation string, returned int, giveUp bool) {
	queue := allocation == "queue"
	// Admissions after the first wave: at once, or, when the admitted
	// losers give up, slowly enough that most of the crowd beyond the
	// first wave still waits when the test sees the sell-out (places told
	// SOLD_OUT stop counting against the cap, so at 1,000 a second every
	// place would be admitted by then on a slow machine, and nobody left
	// to buy the returned units).
	rate := 1000
	if giveUp {
		rate = 5
	}
	const units, crowd = 100, 300
	// The crowd joins the pre-queue; the draw admits the first wave (2 ×
	// the stock) at once, with tokens that buy from the opening.
	s := startStack(t, func(c *wiring.Config) { c.WSMaxConnsPerAddr = 2 * crowd; c.DrawLead = 2 * time.Second })
	opening := time.Now().Add(5 * time.Second).Truncate(time.Second)
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": "returns", "startsAt": opening.UTC().Format(time.RFC3339), "admissionRatePerSecond": rate, "allocation": allocation,
		"items": []map[string]any{{"productId": 1, "quantity": units, "priceCents": 1999, "name": "Sneaker", "currency": "EUR"}},
	})
	s.Want(r, 201, "")
	saleID := int64(r.Body["id"].(float64))
	item := int64(r.Body["items"].([]any)[0].(map[string]any)["id"].(float64))
	s.waitSale(saleID)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	shoppers := make([]*returnShopper, crowd)
	url := strings.Replace(s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	for i := range shoppers {
		sh := &returnShopper{user: int64(5000 + i)}
		shoppers[i] = sh
		c, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		msg, _ := json.Marshal(map[string]string{"type": "join", "accessToken": s.Token(sh.user, false)})
		if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
			t.Fatal(err)
		}
		wake := make(chan struct{}, 1)
		poke := func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
		wg.Add(2)
		go func() { // the room's messages
			defer wg.Done()
			defer c.CloseNow()
			for {
				_, data, err := c.Read(ctx)
				if err != nil {
					return
				}
				var m struct {
					Type, State, AdmissionToken string
					NotBeforeMs                 int64
					SoldOutItems                *[]int64
				}
				_ = json.Unmarshal(data, &m)
				sh.mu.Lock()
				switch {
				case m.Type == "admitted":
					sh.token, sh.notBefore = m.AdmissionToken, time.UnixMilli(m.NotBeforeMs)
				case m.Type == "status" && m.State == "SOLD_OUT":
					sh.soldOut++
				}
				if m.Type == "status" {
					sh.state = m.State
					if m.SoldOutItems != nil {
						sh.roomOut = slices.Contains(*m.SoldOutItems, item)
						sh.itemOut = sh.roomOut
					}
				}
				sh.mu.Unlock()
				poke()
			}
		}()
		go func() { // the shopper's clicks
			defer wg.Done()
			var recheck <-chan time.Time
			for {
				select {
				case <-ctx.Done():
					return
				case <-wake:
				case <-recheck:
					// A SOLD_OUT answer for an item the room still lists
					// as available is stale: look again, as the page does.
					recheck = nil
					sh.mu.Lock()
					sh.itemOut = sh.roomOut
					sh.mu.Unlock()
				}
				sh.mu.Lock()
				// A holder (queue order) buys its unit even when the item
				// is sold out for everyone else, as the page lets it.
				buy := sh.token != "" && sh.state != "SOLD_OUT" && (!sh.itemOut || queue) && len(sh.bought) == 0 && !sh.cancelled && !sh.gaveUp
				token, notBefore := sh.token, sh.notBefore
				sh.mu.Unlock()
				if !buy {
					continue
				}
				waitUntil(notBefore) // a first-wave token buys from the opening
				r := s.purchase(sh.user, item, token)
				sh.mu.Lock()
				if sh.answers == nil {
					sh.answers = map[string]int{}
				}
				code, _ := r.Body["error"].(string)
				sh.answers[fmt.Sprint(r.Status, code)]++
				switch r.Status {
				case 202:
					sh.bought = append(sh.bought, r.Body["orderId"].(string))
				case 410:
					sh.itemOut = true
					if !sh.roomOut {
						recheck = time.After(time.Second)
					}
				}
				sh.mu.Unlock()
			}
		}()
	}

	count := func(f func(sh *returnShopper) bool) int {
		n := 0
		for _, sh := range shoppers {
			sh.mu.Lock()
			if f(sh) {
				n++
			}
			sh.mu.Unlock()
		}
		return n
	}
	// A holder stays ADMITTED through the sell-out (queue order).
	waitFor(t, "the sell-out, told to every shopper", func() bool {
		return count(func(sh *returnShopper) bool { return len(sh.bought) == 1 }) == units &&
			count(func(sh *returnShopper) bool { return sh.state == "SOLD_OUT" || (queue && len(sh.bought) == 1) }) == crowd
	})

	if n := count(func(sh *returnShopper) bool { return sh.token != "" }); !queue && n < 2*units {
		t.Fatalf("%d shoppers admitted at the sell-out, want at least the first wave, %d", n, 2*units)
	} else if queue && n != units {
		t.Fatalf("%d shoppers admitted at the sell-out, want one per unit, %d", n, units)
	}
	if giveUp {
		for _, sh := range shoppers {
			sh.mu.Lock()
			sh.gaveUp = sh.token != "" && len(sh.bought) == 0
			sh.mu.Unlock()
		}
	}
	// Buyers give their units back.
	var first []*returnShopper
	for _, sh := range shoppers {
		sh.mu.Lock()
		if len(sh.bought) == 1 && len(first) < returned {
			sh.cancelled = true
			first = append(first, sh)
		}
		sh.mu.Unlock()
	}
	for _, sh := range first {
		s.waitPayable(sh.user, sh.bought[0]) // recorded: cancellable
		r := s.Do("POST", "/api/flash-sales/orders/"+sh.bought[0]+"/cancel", s.Token(sh.user, false), nil)
		s.Want(r, 200, "")
	}

	testenv.EventuallyF(t, func() string {
		states, answers := map[string]int{}, map[string]int{}
		for _, sh := range shoppers {
			sh.mu.Lock()
			states[sh.state]++
			for k, v := range sh.answers {
				answers[k] += v
			}
			sh.mu.Unlock()
		}
		return fmt.Sprintf("every returned unit sold again: %d of %d; states %v, %d admitted, %d gave up; purchase answers %v",
			count(func(sh *returnShopper) bool { return len(sh.bought) == 1 && !sh.cancelled })-(units-returned), returned, states,
			count(func(sh *returnShopper) bool { return sh.token != "" }), count(func(sh *returnShopper) bool { return sh.gaveUp }), answers)
	}, time.Minute, func() bool {
		return count(func(sh *returnShopper) bool { return len(sh.bought) == 1 && !sh.cancelled }) == units
	})
	// The operator's figures agree: every unit sold, none left, none more.
	var it map[string]any
	testenv.EventuallyF(t, func() string {
		return fmt.Sprintf("the item's figures to read %d sold and 0 remaining: %v", units, it)
	}, 30*time.Second, func() bool {
		g := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d", saleID), s.Token(1, true), nil)
		s.Want(g, 200, "")
		it = g.Body["items"].([]any)[0].(map[string]any)
		return it["sold"] == float64(units) && it["remaining"] == float64(0)
	})
	if queue {
		// Each returned unit went to a shopper told SOLD_OUT before, now
		// admitted with it; everyone else without a unit is still told
		// SOLD_OUT.
		late := count(func(sh *returnShopper) bool { return len(sh.bought) == 1 && !sh.cancelled && sh.soldOut > 0 })
		if late != returned {
			t.Errorf("%d returned units bought by shoppers told SOLD_OUT before, want %d", late, returned)
		}
		waitFor(t, "every shopper without a unit told SOLD_OUT", func() bool {
			return count(func(sh *returnShopper) bool { return len(sh.bought) == 0 && sh.state != "SOLD_OUT" }) == 0
		})
		return
	}
	// Every shopper who had no unit was told SOLD_OUT, then told the sale
	// was back (a WAITING or ADMITTED state after it), then, those who
	// did not buy, SOLD_OUT again.
	waitFor(t, "every shopper told of the second sell-out", func() bool {
		return count(func(sh *returnShopper) bool { return sh.state == "SOLD_OUT" }) == crowd
	})
	unaware := 0
	for _, sh := range shoppers {
		sh.mu.Lock()
		if sh.soldOut < 2 && len(sh.bought) == 0 {
			unaware++
		}
		sh.mu.Unlock()
	}
	if unaware > 0 {
		t.Errorf("%d shoppers without a unit never heard that units were back (SOLD_OUT once only)", unaware)
	}
}
