package browsertest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/wiring"
)

// TestQueueOrderHoldReachesNext: a sale of one unit allocated in queue
// order, with a 10 s claim window. Shopper A, alone in the pre-queue, is
// first: their page says a unit is held for them and, from the opening,
// for how long, with the buy button on (the room lists the item sold out:
// its only unit is held). A never buys. Shopper B, who joined after the
// draw, sees the sale sold out while A holds the unit; when A's window
// ends, B's page shows the unit held for B with the buy button on, and B
// buys it. A's page says the turn ended.
func TestQueueOrderHoldReachesNext(t *testing.T) {
	s := startStack(t, func(c *wiring.Config) { c.DrawLead = 4 * time.Second })
	opens := time.Now().Add(9 * time.Second)
	const window = 10
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": "Queue order", "startsAt": opens.UTC().Format(time.RFC3339Nano), "admissionRatePerSecond": 100,
		"allocation": "queue", "claimWindowSeconds": window,
		"items": []map[string]any{{"productId": 501, "quantity": 1, "priceCents": 1999}},
	})
	s.Want(r, 201, "")
	saleID := int64(r.Body["id"].(float64))
	item := int64(r.Body["items"].([]any)[0].(map[string]any)["id"].(float64))
	buy := fmt.Sprintf("buy-%d", item)

	b := newBrowser(t)
	a := b.tab("A")
	a.navigate(s.shopperURL(s.App.PublicURL, saleID, 7201, ""))
	a.waitState("PREQUEUE")
	a.waitState("ADMITTED")
	if !time.Now().Before(opens) {
		t.Fatalf("A admitted at %v, after the opening %v: the first wave's hold comes at the draw", time.Now(), opens)
	}
	a.waitJS("A's hold before the opening", `document.getElementById('admission-expiry').textContent.includes('held for you')`)
	// B joins after the draw: the place after A's.
	bb := b.tab("B")
	bb.navigate(s.shopperURL(s.App.PublicURL, saleID, 7202, ""))
	bb.waitState("SOLD_OUT")

	// From the opening A may buy (the item is listed sold out: its unit
	// is A's), and the page counts the window down.
	a.waitJS("A's buy button on", fmt.Sprintf(`(() => { const b = document.getElementById(%q); return !!b && !b.disabled; })()`, buy))
	a.waitJS("A's window counting down", `document.getElementById('admission-expiry').textContent.includes('Held for you for')`)
	a.screenshot("queue-order-held")
	if txt := a.text("#admission-expiry"); !strings.Contains(txt, "next in line") {
		t.Fatalf("A's page says %q; want what happens when the window ends", txt)
	}
	if got := bb.text("#" + buy); got != "" {
		t.Fatalf("B has a buy button (%q) while A holds the only unit", got)
	}

	// A's window ends unused: the unit is held for B, whose page shows it.
	bb.waitState("ADMITTED")
	if end := opens.Add(window * time.Second); time.Now().Before(end) {
		t.Fatalf("B admitted at %v, before A's window ended at %v", time.Now(), end)
	}
	bb.waitJS("B's hold counting down", `document.getElementById('admission-expiry').textContent.includes('Held for you for')`)
	bb.screenshot("queue-order-next-in-line")
	buyAndPay(bb, item)
	if o := orderOf(s, 7202, saleID); o["status"] != "PAID" {
		t.Fatalf("B's order by API = %v", o)
	}
	a.waitJS("A's turn ended", `document.getElementById('admission-expiry').textContent.trim() === '' || document.getElementById('admission-expiry').textContent.includes('ended')`)
	if got := evalT[bool](a, fmt.Sprintf(`(() => { const b = document.getElementById(%q); return !!b && !b.disabled; })()`, buy)); got {
		t.Fatal("A's buy button is still on after the window")
	}
}
