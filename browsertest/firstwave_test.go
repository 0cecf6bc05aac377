package browsertest

import (
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/wiring"
)

// TestFirstWaveBuyAtOpening: with a draw lead the shopper is admitted
// before the opening (the first wave); the page shows the admission, keeps
// the buy button off while the server-synced clock is before the opening,
// turns it on at the opening instant, and the purchase goes through.
func TestFirstWaveBuyAtOpening(t *testing.T) {
	s := startStack(t, func(c *wiring.Config) { c.DrawLead = 8 * time.Second })
	opens := time.Now().Add(12 * time.Second)
	saleID, items := s.createSale("First wave", opens, 100, 5)
	b := newBrowser(t)
	tb := b.tab("")
	tb.navigate(s.shopperURL(s.App.PublicURL, saleID, 7101, ""))
	tb.waitState("ADMITTED")
	if !time.Now().Before(opens) {
		t.Fatalf("admitted at %v, after the opening %v: the first wave comes at the draw", time.Now(), opens)
	}
	buy := fmt.Sprintf("buy-%d", items[0])
	tb.waitJS("buy button shown", fmt.Sprintf(`!!document.getElementById(%q)`, buy))
	// Record, in the page, the first instant the button is enabled.
	disabled := evalT[bool](tb, fmt.Sprintf(`(() => {
	  window.__enabledAt = 0;
	  const check = () => {
	    const b = document.getElementById(%q);
	    if (b && !b.disabled && !window.__enabledAt) window.__enabledAt = Date.now();
	  };
	  new MutationObserver(check).observe(document.documentElement, {subtree: true, childList: true, attributes: true});
	  check();
	  const b = document.getElementById(%q);
	  return b.disabled && b.dataset.opensAt === 'pending';
	})()`, buy, buy))
	if before := time.Now().Before(opens); !disabled && before {
		t.Fatalf("buy button enabled before the opening")
	}
	if time.Now().Before(opens.Add(-time.Second)) {
		tb.waitJS("countdown to the opening in #admission-expiry", `document.getElementById('admission-expiry').textContent.trim() !== ''`)
		tb.screenshot("first-wave-before-opening")
	}
	tb.waitJS("buy button on", `window.__enabledAt > 0`)
	// The page's clock is synced with the server's, this machine's: the
	// button turns on at the opening, not before (a few milliseconds of
	// sync error allowed).
	if at := evalT[float64](tb, `window.__enabledAt`); int64(at) < opens.UnixMilli()-50 {
		t.Fatalf("buy button on at %d, before the opening %d", int64(at), opens.UnixMilli())
	}
	buyAndPay(tb, items[0])
	if o := orderOf(s, 7101, saleID); o["status"] != "PAID" {
		t.Fatalf("order by API = %v", o)
	}
}
