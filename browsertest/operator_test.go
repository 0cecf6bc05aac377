package browsertest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestOperatorRateAndBlock: the operator changes the admission rate and
// blocks a user in the console; the change is live in the API and in the
// audit list, and the blocked user's tabs show BLOCKED.
func TestOperatorRateAndBlock(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale("Console drop", time.Now().Add(-time.Second), 50, 10)
	const user = 4242
	b := newBrowser(t)

	// The shopper is in the queue before the block, in two tabs: one on
	// the WebSocket (admitted), one polling.
	ws := b.tab("shopper-ws")
	ws.navigate(s.shopperURL(s.App.PublicURL, saleID, user, ""))
	ws.waitState("ADMITTED")
	ws.do("buy button", chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf("#buy-%d", items[0]))))
	poll := b.tab("shopper-polling")
	poll.navigate(s.shopperURL(s.App.PublicURL, saleID, user, "?transport=polling"))
	poll.waitState("ADMITTED")

	op := b.tab("")
	op.navigate(s.operatorURL(saleID))
	op.do("console with figures",
		chromedp.WaitVisible(chromedp.CSS("#figures-body")),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf("#op-sale-%d", saleID))),
	)
	op.waitJS("rate shown", `document.getElementById('fig-rate-setting').textContent.trim() === '50/s'`)

	// Admission rate, through the console's own form.
	op.do("set rate",
		chromedp.SetValue(chromedp.CSS("#rate-input"), "7"),
		chromedp.Click(chromedp.CSS("#rate-apply")),
	)
	op.waitJS("rate change reported", `document.getElementById('change-result').textContent.includes('Admission rate set to 7/s')`)
	op.waitJS("rate figure updated", `document.getElementById('fig-rate-setting').textContent.trim() === '7/s'`)
	if got := s.adminSale(saleID)["admissionRatePerSecond"]; got != float64(7) {
		t.Fatalf("GET /api/admin/sales/%d admissionRatePerSecond = %v, want 7", saleID, got)
	}
	op.screenshot("rate-changed")

	// Block the user.
	op.do("block user",
		chromedp.SetValue(chromedp.CSS("#block-user-input"), fmt.Sprint(user)),
		chromedp.Click(chromedp.CSS("#block-user-apply")),
	)
	op.waitJS("block reported with its audit entry", fmt.Sprintf(`document.getElementById('change-result').textContent.includes('User %d blocked. Audit #')`, user))
	// The entry reads as a change, in words, not as the settings document.
	op.waitJS("audit entry highlighted", fmt.Sprintf(`(() => {
	  const li = document.querySelector('#audit-list li.fresh');
	  return !!li && [...li.querySelectorAll('ul.diff li')].some((d) => d.textContent === 'blocked users: (none) → %d');
	})()`, user))
	if got := op.text("#audit-list li.fresh"); strings.Contains(got, `"before"`) || strings.Contains(got, "blocklist.") ||
		!strings.Contains(got, "operator 1 · bot-defense settings changed") || !strings.Contains(got, "version: ") {
		t.Errorf("the audit entry does not read as a change: %q", got)
	}
	op.waitJS("blocked user chip", fmt.Sprintf(`document.getElementById('block-users').textContent.includes('%d')`, user))
	op.screenshot("user-blocked")
	change := op.text("#change-result")
	auditID := strings.TrimSuffix(strings.Fields(change[strings.Index(change, "Audit #")+len("Audit #"):])[0], ":")
	if got := op.text("#audit-" + auditID); !strings.Contains(got, fmt.Sprint(user)) {
		t.Errorf("#audit-%s = %q, want the blocklist change", auditID, got)
	}

	// The polling tab is refused at its next poll.
	poll.do("polling tab BLOCKED", chromedp.WaitVisible(chromedp.CSS(`#error[data-error="BLOCKED"]`)))
	if got := poll.text("#queue-state"); got != "not joined" {
		t.Errorf("polling tab #queue-state = %q after BLOCKED, want not joined", got)
	}
	poll.screenshot("blocked")

	// A new tab of the same user cannot join.
	again := b.tab("shopper-new-tab")
	again.navigate(s.shopperURL(s.App.PublicURL, saleID, user, ""))
	again.do("new tab BLOCKED",
		chromedp.WaitVisible(chromedp.CSS(`#error[data-error="BLOCKED"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#queue-state[data-state="ERROR"]`)),
	)
	again.screenshot("blocked")

	// The tab admitted before the block cannot buy.
	ws.do("buy refused", chromedp.Click(chromedp.CSS(fmt.Sprintf("#buy-%d", items[0]))),
		chromedp.WaitVisible(chromedp.CSS(`#result[data-result="BLOCKED"]`)))
	ws.screenshot("buy-blocked")
	r := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), s.Token(user, false), nil)
	if r.Status == 200 {
		t.Fatalf("blocked user holds an order: %s", r.Raw)
	}
}
