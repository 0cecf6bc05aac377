package wiring_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// TestFirstWaveEndToEnd: with a draw lead, a whole stack closes the
// pre-queue and draws before the opening, publishes the seed and the draw
// record from then, and admits the first wave with tokens valid from the
// opening: an early purchase is 403 NOT_ADMITTED and reserves nothing, the
// same token buys at the opening. Every answer is checked against
// docs/openapi.yaml (notBeforeMs included).
func TestFirstWaveEndToEnd(t *testing.T) {
	s := apptest.Start(t, func(c *wiring.Config) { c.DrawLead = 6 * time.Second })
	c := newSpecCheck(t, s)
	op := s.Token(1, true)
	opens := time.Now().Add(9 * time.Second)
	created := c.call(false, "POST", "/api/admin/sales", op, map[string]any{
		"name": "first wave", "startsAt": opens.UTC().Format(time.RFC3339Nano), "admissionRatePerSecond": 1, "allocation": "race",
		"items": []map[string]any{{"productId": 501, "quantity": 3, "priceCents": 1999}},
	})
	c.s.Want(created, 201, "")
	saleID := int64(created.Body["id"].(float64))
	itemID := int64(created.Body["items"].([]any)[0].(map[string]any)["id"].(float64))
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	for _, u := range []int64{200, 201} {
		c.s.Want(c.call(false, "POST", queue, s.Token(u, false), nil), 200, "")
	}
	if pub := c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d", saleID), "", nil); pub.Body["shuffleSeed"] != nil {
		t.Fatalf("seed public before the close: %s", pub.Raw)
	}

	// The first wave: both shoppers (3 units × factor 2 = 6 places).
	var tok string
	deadline := time.Now().Add(20 * time.Second) // guards against a hang only
	for tok == "" {
		a := c.call(false, "GET", queue, s.Token(200, false), nil)
		c.s.Want(a, 200, "")
		if at, _ := a.Body["admissionToken"].(string); at != "" {
			// The opening rounded up to the millisecond (opensAtMs is it
			// rounded down).
			nb, _ := a.Body["notBeforeMs"].(float64)
			if o, _ := a.Body["opensAtMs"].(float64); nb != o && nb != o+1 {
				t.Fatalf("first-wave admission %s: want notBeforeMs at opensAtMs", a.Raw)
			}
			tok = at
		}
		if time.Now().After(deadline) {
			t.Fatal("not admitted before the opening")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !time.Now().Before(opens) {
		t.Fatalf("admitted only after the opening")
	}
	if pub := c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d", saleID), "", nil); pub.Body["shuffleSeed"] == nil {
		t.Fatalf("seed not public after the close: %s", pub.Raw)
	}
	// The leader stores the record right after the draw.
	waitFor(t, "the draw record", func() bool {
		return c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/draw", saleID), "", nil).Status == 200
	})
	// Over the WebSocket the first wave's admitted message (validated
	// against the file: notBeforeMs is documented there).
	if got := c.wsJoin(saleID, map[string]string{"type": "join", "accessToken": s.Token(201, false)}, "admitted"); got[len(got)-1] != "admitted" {
		t.Fatalf("WebSocket messages %v, want the admission before the opening", got)
	}

	shopper := s.Token(200, false)
	purchase := fmt.Sprintf("/api/flash-sales/items/%d/purchase", itemID)
	c.s.Want(c.call(false, "POST", purchase, shopper, nil, "X-Admission-Token", tok), 403, "NOT_ADMITTED")
	c.s.Want(c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), shopper, nil), 404, "NOT_FOUND")
	if !time.Now().Before(opens) {
		t.Fatalf("the early purchase ran after the opening: the test proves nothing")
	}

	time.Sleep(time.Until(opens)) // the opening instant is what is tested
	var bought apptest.Resp
	for {
		bought = c.call(false, "POST", purchase, shopper, nil, "X-Admission-Token", tok)
		// The gateway's clock and this one are the machine's; a purchase
		// a moment before the gateway's opening is refused as early.
		if bought.Status != 403 || time.Now().After(opens.Add(5*time.Second)) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.s.Want(bought, 202, "")
}
