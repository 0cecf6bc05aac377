package wiring_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// TestFirstWaveEndToEnd: with a draw lead, a whole stack closes the
// pre-queue and draws before the opening, publishes the seed and the draw
// record from then, and admits the first wave with tokens valid from the
// opening: an early purchase is 403 NOT_ADMITTED and reserves nothing, the
// same token buys at the opening. Every answer is checked against
// docs/openapi.yaml (notBeforeMs included). The stack's fleet clock is
// the test's, which jumps to the close and to the opening.
func TestFirstWaveEndToEnd(t *testing.T) {
	var clock jumpClock
	s := apptest.Start(t, func(c *wiring.Config) { c.DrawLead = 6 * time.Second; c.Clock = clock.Now })
	c := newSpecCheck(t, s)
	op := s.Token(1, true)
	opens := clock.Now().Add(9 * time.Second)
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

	// The pre-queue closes (the draw lead before the opening) and the
	// first wave is drawn: both shoppers (3 units × factor 2 = 6 places).
	clock.AdvanceTo(opens.Add(-6 * time.Second))
	var notBefore time.Time
	tok := testenv.EventuallyValue(t, "the first-wave admission", 20*time.Second, func() (string, bool) {
		a := c.call(false, "GET", queue, s.Token(200, false), nil)
		c.s.Want(a, 200, "")
		at, _ := a.Body["admissionToken"].(string)
		if at != "" {
			// The opening rounded up to the millisecond (opensAtMs is it
			// rounded down).
			nb, _ := a.Body["notBeforeMs"].(float64)
			if o, _ := a.Body["opensAtMs"].(float64); nb != o && nb != o+1 {
				t.Fatalf("first-wave admission %s: want notBeforeMs at opensAtMs", a.Raw)
			}
			notBefore = time.UnixMilli(int64(nb))
		}
		return at, at != ""
	})
	if !clock.Now().Before(opens) {
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
	if !clock.Now().Before(opens) {
		t.Fatalf("the early purchase ran after the opening: the test proves nothing")
	}

	// The opening instant is what is tested: the token buys from it.
	clock.AdvanceTo(notBefore)
	c.s.Want(c.call(false, "POST", purchase, shopper, nil, "X-Admission-Token", tok), 202, "")
}
