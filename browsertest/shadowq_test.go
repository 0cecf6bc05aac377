package browsertest

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestShadowQueueConsole: the operator turns the shadow queue on for the
// blocklist and blocks a user in the console; the user's page waits like
// anyone's (WAITING, never BLOCKED, never admitted) while the console
// lists them in the sale's shadow queue; the operator releases them from
// the list, and their page joins again and is admitted.
func TestShadowQueueConsole(t *testing.T) {
	s := startStack(t)
	saleID, _ := s.createSale("Shadow drop", time.Now().Add(-time.Second), 50, 10)
	const user = 5151
	b := newBrowser(t)

	op := b.tab("")
	op.navigate(s.operatorURL(saleID))
	op.do("console with figures", chromedp.WaitVisible(chromedp.CSS("#figures-body")))
	op.waitJS("shadow queue knobs", `!!document.getElementById('sq-rule-blocklist')`)
	op.do("shadow the blocklist", chromedp.Click(chromedp.CSS("#sq-rule-blocklist")))
	op.waitJS("shadow queue on", `document.getElementById('change-result').textContent.includes('Shadow queue on for blocklisted address or user')`)
	op.do("block user",
		chromedp.SetValue(chromedp.CSS("#block-user-input"), fmt.Sprint(user)),
		chromedp.Click(chromedp.CSS("#block-user-apply")),
	)
	op.waitJS("block reported", fmt.Sprintf(`document.getElementById('change-result').textContent.includes('User %d blocked.')`, user))

	shopper := b.tab("shadowed")
	shopper.navigate(s.shopperURL(s.App.PublicURL, saleID, user, ""))
	shopper.waitState("WAITING")
	op.waitJS("the shadowed shopper listed", fmt.Sprintf(`(() => {
	  const s = document.getElementById('shadowq-summary').textContent;
	  return s.includes('1 in the shadow queue') && s.includes('blocklisted address or user (1)') &&
	    !!document.querySelector('[data-testid="sq-release-%d"]');
	})()`, user))
	op.screenshot("shadow-queue")
	if got := shopper.text("#queue-state"); got == "admitted" {
		t.Fatalf("the shadowed shopper's page says %q", got)
	}

	op.do("release", chromedp.Click(chromedp.CSS(fmt.Sprintf(`[data-testid="sq-release-%d"]`, user))))
	op.waitJS("release reported", fmt.Sprintf(`document.getElementById('change-result').textContent.includes('User %d left the shadow queue')`, user))
	op.waitJS("the list updated", `document.getElementById('shadowq-summary').textContent.includes('0 in the shadow queue, 1 released')`)
	shopper.waitState("ADMITTED")
}
