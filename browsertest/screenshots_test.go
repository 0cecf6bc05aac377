package browsertest

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/push"
)

// committedDir holds the screenshots README.md shows.
const committedDir = "../docs/screenshots"

// size is a screen the pages are shown on.
type size struct {
	name          string
	width, height int64
	mobile        bool
}

var sizes = []size{
	{"phone", 390, 844, true},     // iPhone 12–14 in CSS pixels, mobile emulation
	{"desktop", 1280, 800, false}, // a laptop window
}

// shootSizes captures the current page at every size as name-<size>.png:
// always into the test's artifacts, and into docs/screenshots/ when
// FLASHSALE_UPDATE_SCREENSHOTS=1.
func shootSizes(tb *tab, name string) {
	tb.b.t.Helper()
	update := os.Getenv("FLASHSALE_UPDATE_SCREENSHOTS") == "1"
	for _, sz := range sizes {
		tb.viewport(sz.width, sz.height, sz.mobile)
		settle(tb)
		pic := tb.screenshot(name + "-" + sz.name)
		if pic == nil {
			tb.b.t.Fatalf("no screenshot %s-%s", name, sz.name)
		}
		img, err := png.Decode(bytes.NewReader(pic))
		if err != nil {
			tb.b.t.Fatalf("screenshot %s-%s is not a PNG: %v", name, sz.name, err)
		}
		// The page must fit the width: no horizontal scrolling.
		if sw := evalT[int](tb, `document.documentElement.scrollWidth`); int64(sw) > sz.width {
			tb.b.t.Errorf("%s at %s: page is %d px wide, wider than the %d px screen", name, sz.name, sw, sz.width)
		}
		if img.Bounds().Dx() < int(sz.width) {
			tb.b.t.Errorf("%s at %s: image %d px wide, want at least %d", name, sz.name, img.Bounds().Dx(), sz.width)
		}
		if update {
			p := filepath.Join(committedDir, name+"-"+sz.name+".png")
			if err := os.WriteFile(p, pic, 0o644); err != nil {
				tb.b.t.Fatalf("write %s: %v", p, err)
			}
		}
	}
	tb.viewport(1280, 800, false)
}

// settle waits two animation frames, so that a new viewport is laid out and
// painted before the capture.
func settle(tb *tab) {
	tb.b.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, waitFor)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](
		`new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))`, chromedp.EvalAwaitPromise)); err != nil {
		tb.fail("settle", err)
	}
}

// TestScreenshots renders the shopper page (waiting; admitted and paid),
// the operator console and its report view at phone and desktop width, in
// English and Spanish (name-<lang>-<size>.png).
func TestScreenshots(t *testing.T) {
	t.Parallel() // long, and waits on nothing another test holds (browser_test.go)
	if os.Getenv("FLASHSALE_UPDATE_SCREENSHOTS") == "1" {
		if err := os.MkdirAll(committedDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Capacity factor 1 keeps the queue still: as many shoppers admitted
	// as units remain, the rest wait.
	// Push keys: the waiting page offers the turn notification, as a
	// shop that set them up shows it.
	pub, priv, err := push.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	s := startStack(t, func(c *wiring.Config) {
		c.CapacityFactor = 1
		c.PushPublicKey, c.PushPrivateKey, c.PushSubject = pub, priv, "mailto:ops@shop.example"
	})
	item := func(product, quantity, price int, name string) map[string]any {
		return map[string]any{"productId": product, "quantity": quantity, "priceCents": price, "currency": "EUR", "name": name, "imageUrl": "/assets/sneaker.svg"}
	}
	winter, winterItems := s.createSaleItems("Winter drop", time.Now().Add(-time.Second), 20,
		item(501, 2, 8999, "Trail runner, blue"), item(502, 3, 12950, "Court classic, white"))
	spring, springItems := s.createSaleItems("Spring drop", time.Now().Add(-time.Second), 500,
		item(601, 50, 5990, "Canvas low, navy"), item(602, 25, 7450, "Knit runner, grey"))

	// Winter: five shoppers admitted (one per unit), one of them buys and
	// pays; six more wait.
	first := s.admit(8101, winter)
	for u := int64(8102); u <= 8105; u++ {
		s.admit(u, winter)
	}
	order := s.buy(8101, winterItems[0], first)
	var paid apptest.Resp
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("the payment (last: %d %s)", paid.Status, paid.Raw) }, 20*time.Second, func() bool {
		paid = s.Do("POST", "/api/flash-sales/orders/"+order+"/pay", s.Token(8101, false), nil)
		return paid.Status == 200
	})
	for u := int64(8106); u <= 8111; u++ {
		s.join(u, winter)
	}
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/message", winter), s.Token(1, true),
		map[string]any{"text": "Winter drop: 5 pairs left / quedan 5 pares"}), 200, "")

	// Spring: a crowd buys first, so that the report shows a sell-out
	// curve: every unit of the knit runner, then some canvas lows.
	for u := int64(8201); u <= 8240; u++ {
		it := springItems[1]
		if u > 8225 {
			it = springItems[0]
		}
		s.buy(u, it, s.admit(u, spring))
	}

	// The shadow queue on for risky sessions: three of them join each
	// sale, so the console lists them and the report counts them.
	doc := strings.Replace(apptest.Permissive, `"blocklist"`, `"shadowQueue": {"riskAbove": 0.8}, "blocklist"`, 1)
	if err := s.App.SetDefense(context.Background(), "test", []byte(doc)); err != nil {
		t.Fatal(err)
	}
	for u := int64(8301); u <= 8303; u++ {
		tok := s.RiskToken(u, 0.95)
		for _, sale := range []int64{winter, spring} {
			s.Want(s.Do("POST", queuePath(sale), tok, nil), 200, "")
		}
	}

	b := newBrowser(t)
	for i, lang := range []string{"en", "es"} {
		user := int64(8120 + i)
		shop := b.tab("shopper-" + lang)
		shop.language(lang)
		shop.navigate(s.shopperURL(s.App.PublicURL, winter, user, ""))
		shop.waitJS("language "+lang, fmt.Sprintf(`document.documentElement.lang === %q`, lang))
		shop.waitState("WAITING")
		shop.waitJS("position, ETA, message and pictures", `document.getElementById('position').textContent !== '–' && document.getElementById('eta').textContent !== '–' &&
		  !document.getElementById('sale-message').hidden && !document.getElementById('notify').hidden &&
		  [...document.querySelectorAll('#items img')].every((i) => i.complete && i.naturalWidth > 0)`)
		shootSizes(shop, "shopper-waiting-"+lang)

		shop.navigate(s.shopperURL(s.App.PublicURL, spring, user, ""))
		shop.waitState("ADMITTED")
		buyAndPay(shop, springItems[0])
		shootSizes(shop, "shopper-paid-"+lang)

		op := b.tab("operator-" + lang)
		op.language(lang)
		op.navigate(s.operatorURL(winter))
		op.do("figures", chromedp.WaitVisible(chromedp.CSS("#figures-body")))
		op.waitJS("items, queue and charts", `document.querySelectorAll('#fig-items tr').length === 2 &&
		  document.getElementById('fig-waiting').textContent.trim() !== '' &&
		  document.querySelectorAll('#charts svg').length > 0 &&
		  document.querySelectorAll('#audit-list li').length > 0 &&
		  document.querySelectorAll('#shadowq-list tr').length === 3`)
		op.do("block a user",
			chromedp.SetValue(chromedp.CSS("#block-user-input"), fmt.Sprint(666+i)),
			chromedp.Click(chromedp.CSS("#block-user-apply")),
		)
		op.waitJS("audit entry", `!!document.querySelector('#audit-list li.fresh')`)
		shootSizes(op, "operator-"+lang)

		// The report after the drop of the spring sale: admissions over
		// WebSockets (measured waits), orders and payments.
		op.navigate(s.reportURL(spring))
		op.waitJS("report with waits", `document.querySelectorAll('#report-charts svg').length === 4 &&
		  document.getElementById('rep-p50').textContent.trim() !== '–' && document.getElementById('rep-paid').textContent.trim() === '`+fmt.Sprint(i+1)+`' &&
		  [...document.querySelectorAll('#report-refusals tr td:last-child')].some((td) => td.textContent.trim() === '3')`)
		shootSizes(op, "report-"+lang)
	}
}
