package browsertest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
)

// buyAndPay clicks the buy button of item, waits until the order can be
// paid, pays, and waits for PAID, with a screenshot at each step.
func buyAndPay(tb *tab, itemID int64) {
	tb.b.t.Helper()
	buy := fmt.Sprintf("#buy-%d", itemID)
	tb.do("buy button", chromedp.WaitVisible(chromedp.CSS(buy)), chromedp.WaitEnabled(chromedp.CSS(buy)))
	tb.screenshot("admitted")
	clickBuy(tb, itemID)
	tb.do("order reserved", chromedp.WaitVisible(chromedp.CSS(`#result[data-result="RESERVED"]`)))
	tb.waitJS("order payable", `(() => {
	  const s = document.getElementById('order-status');
	  return s.dataset.status === 'PENDING' && !document.getElementById('pay').disabled;
	})()`)
	tb.screenshot("payable")
	tb.do("click pay", chromedp.Click(chromedp.CSS("#pay")))
	tb.do("order paid", chromedp.WaitVisible(chromedp.CSS(`#order-status[data-status="PAID"]`)))
	tb.screenshot("paid")
}

// clickBuy clicks the buy button of item. A click sets #result at once (to
// PENDING, before any request). On a loaded machine a re-render can move
// the button between locating it and the mouse event; a click that hit
// nothing is made again from the page's side, which a second purchase
// could not be (the first would have set #result).
func clickBuy(tb *tab, itemID int64) {
	tb.b.t.Helper()
	buy := fmt.Sprintf("#buy-%d", itemID)
	tb.do("click buy", chromedp.WaitVisible(chromedp.CSS(buy)), chromedp.WaitEnabled(chromedp.CSS(buy)), chromedp.Click(chromedp.CSS(buy)))
	if testenv.Wait(2*time.Second, func() bool {
		return evalT[string](tb, `document.getElementById('result').dataset.result || ''`) != ""
	}) {
		return
	}
	tb.b.t.Logf("the buy click hit nothing; clicking %s again", buy)
	evalT[bool](tb, `(() => { document.querySelector('`+buy+`')?.click(); return true; })()`)
}

// orderOf is the order the user holds in the sale, by the API.
func orderOf(s *stack, user, saleID int64) map[string]any {
	s.T.Helper()
	r := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), s.Token(user, false), nil)
	s.Want(r, 200, "")
	return r.Body
}

// prequeueWindow is how long a test gives a started browser to load the
// shopper page and join the pre-queue before the sale opens.
const prequeueWindow = 12 * time.Second

// TestShopperCountdownToPaid: countdown → pre-queue → admitted → buy →
// payable → pay → PAID, on a sale that opens a few seconds after the page.
func TestShopperCountdownToPaid(t *testing.T) {
	s := startStack(t)
	// The page must load, show the countdown and join the pre-queue
	// before the opening: the browser starts first (on a loaded machine
	// that alone took longer than the old 6 s window), and the sale opens
	// prequeueWindow after it is up.
	b := newBrowser(t)
	tb := b.tab("")
	opens := time.Now().Add(prequeueWindow)
	saleID, items := s.createSale("Countdown drop", opens, 100, 5)

	tb.navigate(s.shopperURL(s.App.PublicURL, saleID, 7001, ""))
	// The countdown runs on server time before the opening.
	tb.waitJS("countdown running", `(() => {
	  const c = document.getElementById('countdown');
	  return Number(c.dataset.remainingMs) > 0 && /^\d\d:\d\d:\d\d$|^\d+:\d\d$/.test(c.textContent.trim());
	})()`)
	tb.waitState("PREQUEUE")
	tb.screenshot("countdown-prequeue")
	if time.Now().Before(opens.Add(-time.Second)) {
		if got := evalT[string](tb, `document.getElementById('queue-state').dataset.state`); got != "PREQUEUE" {
			t.Errorf("before the opening #queue-state = %q, want PREQUEUE", got)
		}
	}
	// The token left the address bar at once.
	if href := evalT[string](tb, `location.href`); strings.Contains(href, "token=") {
		t.Errorf("token still in the address: %s", href)
	}
	if got := evalT[string](tb, `document.getElementById('transport').dataset.transport`); got != "websocket" {
		t.Errorf("transport = %q, want websocket", got)
	}

	tb.waitState("ADMITTED")
	if time.Now().Before(opens.Add(-time.Second)) {
		t.Errorf("admitted at %v, more than a second before the opening %v", time.Now(), opens)
	}
	tb.waitJS("countdown says open", `document.getElementById('countdown').textContent.trim() === 'Open now'`)
	buyAndPay(tb, items[0])

	o := orderOf(s, 7001, saleID)
	if o["status"] != "PAID" || o["orderId"] != tb.text("#order-id") {
		t.Fatalf("order by API = %v, page shows %s", o, tb.text("#order-id"))
	}
	// PREQUEUE, a moment of WAITING (position 0) may pass at the opening,
	// then ADMITTED.
	if h := evalT[[]string](tb, `window.__fs.states`); !regexp.MustCompile(`^PREQUEUE,(WAITING,)?ADMITTED$`).MatchString(strings.Join(h, ",")) {
		t.Errorf("queue states seen = %v, want PREQUEUE then ADMITTED", h)
	}
}

// TestWaitingShopperSeesSoldOut: a shopper still WAITING sees SOLD_OUT when
// another shopper buys the last unit.
func TestWaitingShopperSeesSoldOut(t *testing.T) {
	// Capacity factor 1: with one unit left only one shopper is admitted
	// at a time, so the browser shopper stays WAITING behind the buyer.
	s := startStack(t, func(c *wiring.Config) { c.CapacityFactor = 1 })
	saleID, items := s.createSale("Last one", time.Now().Add(-time.Second), 1, 1)
	at := s.admit(8001, saleID)

	b := newBrowser(t)
	tb := b.tab("")
	tb.navigate(s.shopperURL(s.App.PublicURL, saleID, 8002, ""))
	tb.waitState("WAITING")
	tb.do("position shown", chromedp.WaitVisible(chromedp.CSS("#position")))
	tb.screenshot("waiting")
	if got := tb.text("#position"); got != "0" && got != "1" {
		t.Errorf("#position = %q, want the admitted buyer ahead (0 or 1)", got)
	}

	s.buy(8001, items[0], at)
	tb.waitState("SOLD_OUT")
	tb.do("sold-out everywhere",
		chromedp.WaitVisible(chromedp.CSS(`#queue-state[data-state="SOLD_OUT"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#sale-banner[data-state="SOLD_OUT"]`)),
	)
	tb.screenshot("sold-out")
	if h := evalT[[]string](tb, `window.__fs.states`); h[0] != "WAITING" || h[len(h)-1] != "SOLD_OUT" || strings.Contains(strings.Join(h, ","), "ADMITTED") {
		t.Errorf("queue states = %v, want WAITING … SOLD_OUT and never ADMITTED", h)
	}
	if n := evalT[int](tb, fmt.Sprintf(`document.querySelectorAll('#buy-%d').length`, items[0])); n != 0 {
		t.Errorf("a buy button is shown after SOLD_OUT")
	}
	tb.waitJS("countdown says sold out", `document.getElementById('countdown').textContent.trim() === 'Sold out'`)
}

// TestPollingForced: ?transport=polling gets the shopper admitted and
// through a purchase without any WebSocket.
func TestPollingForced(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale("Polling drop", time.Now().Add(-time.Second), 100, 3)
	b := newBrowser(t)
	tb := b.tab("")
	tb.navigate(s.shopperURL(s.App.PublicURL, saleID, 9001, "?transport=polling"))
	tb.waitState("ADMITTED")
	buyAndPay(tb, items[0])
	if got := evalT[string](tb, `document.getElementById('transport').dataset.transport`); got != "polling" {
		t.Errorf("transport = %q, want polling", got)
	}
	if n := evalT[int](tb, `window.__fs.wsCreated`); n != 0 {
		t.Errorf("%d WebSockets opened with ?transport=polling, want 0", n)
	}
	if o := orderOf(s, 9001, saleID); o["status"] != "PAID" {
		t.Fatalf("order = %v, want PAID", o)
	}
}

// TestWebSocketRefusedFallsBack: behind a proxy that refuses WebSocket
// upgrades (as some corporate proxies do), the page gives up on the
// WebSocket by itself, polls, and the shopper still buys and pays.
func TestWebSocketRefusedFallsBack(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale("No WebSocket", time.Now().Add(-time.Second), 100, 3)
	target, err := url.Parse(s.App.PublicURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var refused atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			refused.Add(1)
			http.Error(w, "WebSockets are not allowed here", http.StatusForbidden)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)

	b := newBrowser(t)
	tb := b.tab("")
	tb.navigate(s.shopperURL(proxy.URL, saleID, 9101, ""))
	tb.waitJS("fallback to polling", `window.__fs.transports.includes('polling')`)
	tb.screenshot("fell-back-to-polling")
	tb.waitState("ADMITTED")
	buyAndPay(tb, items[0])
	if created, opened := evalT[int](tb, `window.__fs.wsCreated`), evalT[int](tb, `window.__fs.wsOpened`); created < 2 || opened != 0 {
		t.Errorf("WebSockets created %d, opened %d; want at least 2 tried and none open", created, opened)
	}
	if refused.Load() < 2 {
		t.Errorf("proxy refused %d upgrades, want at least 2", refused.Load())
	}
	if h := evalT[[]string](tb, `window.__fs.transports`); strings.Join(h, ",") != "websocket,polling" {
		t.Errorf("transports = %v, want websocket then polling", h)
	}
	if o := orderOf(s, 9101, saleID); o["status"] != "PAID" {
		t.Fatalf("order = %v, want PAID", o)
	}
}
