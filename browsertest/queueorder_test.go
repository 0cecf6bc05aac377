package browsertest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

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
	t.Parallel() // mostly waits on real windows (browser_test.go)
	s := startStack(t, func(c *wiring.Config) { c.DrawLead = 6 * time.Second })
	// The browser starts before the sale is made, so that A's page has the
	// whole pre-queue (6 s, however slow Chromium's start) to join in.
	b := newBrowser(t)
	a := b.tab("A")
	opens := time.Now().Add(12 * time.Second)
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

// TestQueueOrderItemChoice: a sale of two items, S and M (one unit each),
// allocated in queue order, paused while its shoppers join so that their
// places are their join order. X (by the API) is first and wants S.
// Shopper A's page shows the two items as a choice (checked with axe-core);
// A picks S with a click, and the API reports the choice A's page sent. At
// the resume S's one unit goes to X: A's page says S is sold out and that
// A keeps the place. A picks M with the keyboard: A's page then shows M
// held for A, with a buy button for M only. Shopper B, behind A on a
// Spanish page, picks S too (checked for English left untranslated).
func TestQueueOrderItemChoice(t *testing.T) {
	s := startStack(t)
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": "Choice", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano), "admissionRatePerSecond": 100,
		"allocation": "queue", "claimWindowSeconds": 60,
		"items": []map[string]any{
			{"productId": 601, "quantity": 1, "priceCents": 1999, "name": "Tee S"},
			{"productId": 602, "quantity": 1, "priceCents": 1999, "name": "Tee M"},
		},
	})
	s.Want(r, 201, "")
	saleID := int64(r.Body["id"].(float64))
	items := r.Body["items"].([]any)
	itemS := int64(items[0].(map[string]any)["id"].(float64))
	itemM := int64(items[1].(map[string]any)["id"].(float64))
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/pause", saleID), s.Token(1, true), nil), 200, "")
	const x, userA, userB = 7301, 7302, 7303
	s.join(x, saleID)
	s.Want(s.Do("GET", fmt.Sprintf("%s?itemId=%d", queuePath(saleID), itemS), s.Token(x, false), nil), 200, "")

	b := newBrowser(t)
	a := b.tab("A")
	a.navigate(s.shopperURL(s.App.PublicURL, saleID, userA, ""))
	a.waitState("PAUSED")
	a.waitJS("the choice shown", `!document.getElementById('choice').hidden && document.querySelectorAll('#choice input[type=radio]').length === 2`)
	if got := a.text("#choice legend"); got != "Your item" {
		t.Fatalf("the choice's legend is %q", got)
	}
	a.click(fmt.Sprintf("label[for=choice-%d]", itemS))
	a.waitJS("S picked", `document.getElementById('choice-note').textContent.includes('You picked Tee S')`)
	chosen := func() float64 {
		st := s.Do("GET", queuePath(saleID), s.Token(userA, false), nil)
		s.Want(st, 200, "")
		f, _ := st.Body["chosenItemId"].(float64)
		return f
	}
	if got := chosen(); got != float64(itemS) {
		t.Fatalf("A's choice by API = %v; want S (%d)", got, itemS)
	}
	axe := loadAxe(t)
	checkA11y(a, axe, "queue-choice")
	// The same choice on a Spanish page (shopper B, behind A, wants S too).
	bb := b.tab("B")
	bb.language("es")
	bb.navigate(s.shopperURL(s.App.PublicURL, saleID, userB, ""))
	bb.waitState("PAUSED")
	bb.click(fmt.Sprintf("label[for=choice-%d]", itemS))
	bb.waitJS("S picked on the Spanish page", `document.getElementById('choice-note').textContent.includes('Has elegido Tee S')`)
	checkPage(bb, axe, "queue-choice")

	// The resume: X, first, holds S; A keeps the place and is told S is
	// sold out.
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/resume", saleID), s.Token(1, true), nil), 200, "")
	a.waitJS("S sold out for A", `document.getElementById('choice-note').dataset.soldOut === 'true' &&
		document.getElementById('choice-note').textContent.includes('Tee S is sold out for now. You keep your place')`)
	a.screenshot("queue-choice-sold-out")
	if a.text("#buy-"+fmt.Sprint(itemS)) != "" || a.text("#buy-"+fmt.Sprint(itemM)) != "" {
		t.Fatal("A has a buy button before any unit is held for A")
	}

	// A picks M with the keyboard (arrow keys move a radio group's choice).
	a.do("focus S", chromedp.Focus(chromedp.CSS(fmt.Sprintf("#choice-%d", itemS))))
	a.do("arrow to M", chromedp.KeyEvent(kb.ArrowDown))
	a.waitState("ADMITTED")
	a.waitJS("M held for A", fmt.Sprintf(`(() => { const b = document.getElementById('buy-%d'); return !!b && !b.disabled; })() &&
		/held for you/i.test(document.getElementById('admission-expiry').textContent)`, itemM))
	if got := a.text(fmt.Sprintf("#buy-%d", itemS)); got != "" {
		t.Fatalf("A has a buy button for S (%q) while M is held", got)
	}
	if !evalT[bool](a, `document.getElementById('choice').hidden`) {
		t.Fatal("the choice is still shown after the hold")
	}
	a.screenshot("queue-choice-held")
}

// TestResumeAfterTheSaleDataSaidPaused: a queue sale paused before the
// shopper's page loads; the page reads the sale data (PAUSED) at load and
// at its two early refreshes, the last about 4 s after load, and next in a
// minute or more. The sale is resumed after that refresh: the room's word
// (the first wave's hold, ADMITTED) turns the buy button on at once, not
// when the sale data is read again. Before, the page kept "Paused: buying
// resumes with the sale" for that minute (TestQueueOrderItemChoice failed
// on a loaded machine whenever its resume came after the page's refresh).
func TestResumeAfterTheSaleDataSaidPaused(t *testing.T) {
	s := startStack(t)
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": "Resume", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano), "admissionRatePerSecond": 100,
		"allocation": "queue", "claimWindowSeconds": 60,
		"items": []map[string]any{{"productId": 611, "quantity": 1, "priceCents": 1999, "name": "Tee"}},
	})
	s.Want(r, 201, "")
	saleID := int64(r.Body["id"].(float64))
	item := int64(r.Body["items"].([]any)[0].(map[string]any)["id"].(float64))
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/pause", saleID), s.Token(1, true), nil), 200, "")

	b := newBrowser(t)
	a := b.tab("A")
	a.navigate(s.shopperURL(s.App.PublicURL, saleID, 7401, ""))
	a.waitState("PAUSED")
	// Past the page's early refreshes (1.5 s and 4 s after load): the
	// sale data it holds says PAUSED until the next, a minute away.
	a.waitJS("the page's early sale refreshes done", `performance.now() > 6000`)
	if got := a.text("#sale-banner"); got == "" {
		t.Fatal("no banner while paused")
	}
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/resume", saleID), s.Token(1, true), nil), 200, "")
	a.waitState("ADMITTED")
	// waitJS gives up after 30 s, well before the page's next sale
	// refresh (60–90 s after the last): the button must come from the
	// room's word.
	a.waitJS("the buy button on after the resume", fmt.Sprintf(`(() => { const b = document.getElementById('buy-%d'); return !!b && !b.disabled; })()`, item))
	if st := evalT[string](a, `document.getElementById('sale-banner').dataset.state`); st == "PAUSED" {
		t.Fatalf("banner state %q after the resume", st)
	}
}
