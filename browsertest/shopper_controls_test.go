package browsertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
)

// createSaleItems creates a sale through the operator API with the given
// items (each a map of the item's JSON fields).
func (s *stack) createSaleItems(name string, startsAt time.Time, rate int, items ...map[string]any) (saleID int64, itemIDs []int64) {
	s.T.Helper()
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": name, "startsAt": startsAt.UTC().Format(time.RFC3339Nano),
		"admissionRatePerSecond": rate, "items": items, "allocation": "race",
	})
	s.Want(r, 201, "")
	saleID = int64(r.Body["id"].(float64))
	for _, it := range r.Body["items"].([]any) {
		itemIDs = append(itemIDs, int64(it.(map[string]any)["id"].(float64)))
	}
	return saleID, itemIDs
}

func (s *stack) admin(method string, saleID int64, path string, body any) {
	s.T.Helper()
	s.Want(s.Do(method, fmt.Sprintf("/api/admin/sales/%d%s", saleID, path), s.Token(1, true), body), 200, "")
}

// picture serves a small SVG product picture over https, as a shop's
// image server or CDN (the pages' Content-Security-Policy loads pictures
// from https origins and the site only; the test browser accepts the
// server's own certificate).
func picture(t *testing.T) string {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/svg+xml")
		io.WriteString(w, `<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64"><rect width="64" height="64" fill="#0b5fff"/></svg>`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/sneaker.svg"
}

// selectLanguage chooses a language with the page's switch, as a person
// does (the change event).
func (tb *tab) selectLanguage(lang string) {
	tb.b.t.Helper()
	tb.do("switch to "+lang, chromedp.SetValue(chromedp.CSS("#lang-switch"), lang))
	evalT[bool](tb, `document.getElementById('lang-switch').dispatchEvent(new Event('change')) || true`)
	tb.waitJS("html lang "+lang, fmt.Sprintf(`document.documentElement.lang === %q`, lang))
}

// TestLanguages: the shopper page follows the browser's Accept-Language
// (Spanish here), shows the item's name, picture and price in its currency
// per locale; the switch changes the language at once, is remembered across
// reloads and pages, and sets <html lang>. The console the same.
func TestLanguages(t *testing.T) {
	s := startStack(t)
	img := picture(t)
	saleID, items := s.createSaleItems("Rebajas", time.Now().Add(-time.Second), 100,
		map[string]any{"productId": 501, "quantity": 5, "priceCents": 123456, "currency": "EUR", "name": "Zapatilla roja", "imageUrl": img},
		map[string]any{"productId": 502, "quantity": 5, "priceCents": 1999})
	b := newBrowser(t)
	tb := b.tab("")
	tb.language("es-ES,es;q=0.9,en;q=0.5")
	tb.navigate(s.shopperURL(s.App.PublicURL, saleID, 5001, ""))
	tb.waitJS("Spanish from Accept-Language", `document.documentElement.lang === 'es'`)
	tb.waitState("ADMITTED")
	tb.do("buy button", chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf("#buy-%d", items[0]))))
	item := fmt.Sprintf("#item-%d", items[0])
	checks := func(want map[string]string) {
		t.Helper()
		for expr, v := range want {
			if got := evalT[string](tb, expr); got != v {
				t.Errorf("%s = %q, want %q", expr, got, v)
			}
		}
	}
	checks(map[string]string{
		`document.getElementById('items-title').textContent`:                                  "Artículos",
		`document.getElementById('queue-state').textContent`:                                  "es tu turno",
		`document.querySelector('` + item + ` .price').textContent`:                           "1234,56\u00a0€",
		`document.querySelector('` + item + ` .item-name').textContent`:                       "Zapatilla roja",
		`document.querySelector('` + item + ` img').alt`:                                      "Zapatilla roja",
		`document.querySelector('` + item + ` img').src`:                                      img,
		fmt.Sprintf(`document.querySelector('#item-%d .price').textContent`, items[1]):        "19,99\u00a0US$",
		fmt.Sprintf(`document.getElementById('buy-%d').getAttribute('aria-label')`, items[0]): "Comprar Zapatilla roja",
		`document.getElementById('lang-switch').value`:                                        "es",
	})
	tb.waitJS("picture loaded", `document.querySelector('`+item+` img').complete && document.querySelector('`+item+` img').naturalWidth > 0`)
	tb.screenshot("spanish")
	checkSpanish(tb, "admitted")

	tb.selectLanguage("en")
	checks(map[string]string{
		`document.getElementById('items-title').textContent`:        "Items",
		`document.getElementById('queue-state').textContent`:        "your turn",
		`document.querySelector('` + item + ` .price').textContent`: "€1,234.56",
		`localStorage.getItem('flashsale.lang')`:                    "en",
		`document.title`:                                            "Rebajas · Flash sale",
	})
	tb.screenshot("english")
	// Remembered over a reload, although the browser still prefers Spanish.
	tb.navigate(s.shopperURL(s.App.PublicURL, saleID, 5001, ""))
	tb.waitState("ADMITTED")
	checks(map[string]string{
		`document.documentElement.lang`:                      "en",
		`document.getElementById('items-title').textContent`: "Items",
	})

	// The console: English (remembered), then Spanish with its switch.
	op := b.tab("operator")
	op.language("es-ES,es")
	op.navigate(s.operatorURL(saleID))
	op.do("console", chromedp.WaitVisible(chromedp.CSS("#figures-body")))
	op.waitJS("English console", `document.documentElement.lang === 'en' && document.getElementById('sales-title').textContent === 'Sales'`)
	op.selectLanguage("es")
	op.waitJS("Spanish console", `document.getElementById('sales-title').textContent === 'Ventas' && document.getElementById('ctl-pause').textContent === 'Pausar la venta'`)
	op.waitJS("figures relabelled", `document.getElementById('fig-state').textContent === 'abierta'`)
	checkSpanish(op, "operator")
	if got := evalT[string](op, `localStorage.getItem('flashsale.lang')`); got != "es" {
		t.Errorf("stored language = %q, want es", got)
	}
}

// TestShopperPausedMessageAndStock: a waiting shopper sees the operator's
// message, PAUSED with its explanation while keeping the place, waiting
// again after the resume, SOLD_OUT, and is admitted and buys when the
// operator adds stock.
func TestShopperPausedMessageAndStock(t *testing.T) {
	// Capacity factor 1: one unit left admits one shopper at a time.
	s := startStack(t, func(c *wiring.Config) { c.CapacityFactor = 1 })
	saleID, items := s.createSale("Pause drop", time.Now().Add(-time.Second), 1, 1)
	at := s.admit(6001, saleID)
	b := newBrowser(t)
	tb := b.tab("")
	tb.navigate(s.shopperURL(s.App.PublicURL, saleID, 6002, ""))
	tb.waitState("WAITING")
	pos := tb.text("#position")

	s.admin("POST", saleID, "/message", map[string]any{"text": "  Más unidades a las 10:00  "})
	tb.waitJS("message shown", `!document.getElementById('sale-message').hidden && document.getElementById('sale-message-text').textContent === 'Más unidades a las 10:00'`)
	if live := evalT[string](tb, `document.getElementById('sale-message').getAttribute('aria-live')`); live != "polite" {
		t.Errorf("message region aria-live = %q, want polite", live)
	}

	s.admin("POST", saleID, "/pause", nil)
	tb.waitState("PAUSED")
	tb.waitJS("paused everywhere", `document.getElementById('sale-banner').dataset.state === 'PAUSED' &&
	  document.getElementById('countdown').textContent === 'Paused' &&
	  document.getElementById('queue-help').textContent.includes('you keep your place')`)
	tb.screenshot("paused")
	if got := tb.text("#position"); got != pos {
		t.Errorf("while paused #position = %q, want the place kept (%q)", got, pos)
	}
	s.admin("POST", saleID, "/resume", nil)
	tb.waitJS("waiting again", `document.getElementById('queue-state').dataset.state === 'WAITING' && document.getElementById('sale-banner').dataset.state !== 'PAUSED'`)

	// Sold out, then the operator adds one unit: the shopper is admitted.
	s.buy(6001, items[0], at)
	tb.waitState("SOLD_OUT")
	s.admin("POST", saleID, fmt.Sprintf("/items/%d/stock", items[0]), map[string]any{"add": 1})
	tb.waitJS("admitted after the new stock", `document.getElementById('queue-state').dataset.state === 'ADMITTED'`)
	buyAndPay(tb, items[0])
	// The message is still there for a shopper who comes later.
	late := b.tab("late")
	late.navigate(s.shopperURL(s.App.PublicURL, saleID, 6003, ""))
	late.waitJS("late joiner sees the message", `document.getElementById('sale-message-text').textContent === 'Más unidades a las 10:00'`)
	s.admin("POST", saleID, "/message", map[string]any{"text": ""})
	late.waitJS("message cleared", `document.getElementById('sale-message').hidden`)
}

// shopProxy stands between the browser and flashsale: it can hold the
// queue's polling answers back (503), and add a paymentUrl to order answers
// as a gateway with FLASHSALE_PAYMENT_URL does.
type shopProxy struct {
	*httptest.Server
	freezeQueue atomic.Bool
	freezeSale  atomic.Bool            // the public sale data, which tells of a pause too
	paymentURL  atomic.Pointer[string] // with {orderId}
	simPays     atomic.Int64
}

var salePath = regexp.MustCompile(`^/api/flash-sales/sales/\d+$`)

var orderPath = regexp.MustCompile(`^/api/flash-sales/(orders/[^/]+|sales/\d+/order)$`)

func newShopProxy(t *testing.T, s *stack) *shopProxy {
	t.Helper()
	target, err := url.Parse(s.App.PublicURL)
	if err != nil {
		t.Fatal(err)
	}
	p := &shopProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(res *http.Response) error {
		tmpl := p.paymentURL.Load()
		if tmpl == nil || res.StatusCode != 200 || !orderPath.MatchString(res.Request.URL.Path) {
			return nil
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return err
		}
		var o map[string]any
		if json.Unmarshal(body, &o) == nil && o["status"] == "PENDING" {
			if id, ok := o["orderId"].(string); ok {
				o["paymentUrl"] = strings.ReplaceAll(*tmpl, "{orderId}", url.PathEscape(id))
				body, _ = json.Marshal(o)
			}
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		res.ContentLength = int64(len(body))
		res.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/pay") {
			p.simPays.Add(1)
		}
		if (p.freezeQueue.Load() && strings.HasSuffix(r.URL.Path, "/queue")) ||
			(p.freezeSale.Load() && salePath.MatchString(r.URL.Path)) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"UNAVAILABLE","message":"held back by the test"}`, http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// TestSalePausedRefusal: a shopper admitted before the pause, whose page has
// not heard of it yet, clicks buy: the refusal SALE_PAUSED is shown, the
// page shows PAUSED and keeps the admission, and after the resume the same
// admission buys.
func TestSalePausedRefusal(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale("Refusal drop", time.Now().Add(-time.Second), 100, 3)
	proxy := newShopProxy(t, s)
	b := newBrowser(t)
	tb := b.tab("")
	tb.navigate(s.shopperURL(proxy.URL, saleID, 6101, "?transport=polling"))
	tb.waitState("ADMITTED")
	buy := fmt.Sprintf("#buy-%d", items[0])
	tb.do("buy button", chromedp.WaitVisible(chromedp.CSS(buy)), chromedp.WaitEnabled(chromedp.CSS(buy)))
	// The page must not hear of the pause before the click: neither its
	// queue status nor its sale data get through until the refusal.
	proxy.freezeQueue.Store(true)
	proxy.freezeSale.Store(true)
	s.admin("POST", saleID, "/pause", nil)
	clickBuy(tb, items[0])
	tb.do("refusal shown", chromedp.WaitVisible(chromedp.CSS(`#result[data-result="SALE_PAUSED"]`)))
	proxy.freezeSale.Store(false)
	tb.waitJS("page paused", `document.getElementById('queue-state').dataset.state === 'PAUSED' && document.getElementById('sale-banner').dataset.state === 'PAUSED'`)
	if got := tb.text("#result"); !strings.Contains(got, "nothing was reserved") || !strings.Contains(got, "keep your place") {
		t.Errorf("#result = %q, want the pause explained", got)
	}
	tb.screenshot("sale-paused")
	r := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), s.Token(6101, false), nil)
	if r.Status != 404 {
		t.Fatalf("order after SALE_PAUSED: %d %s, want 404 (nothing reserved)", r.Status, r.Raw)
	}
	s.admin("POST", saleID, "/resume", nil)
	proxy.freezeQueue.Store(false)
	tb.waitJS("admitted again", `document.getElementById('queue-state').dataset.state === 'ADMITTED'`)
	buyAndPay(tb, items[0])
}

// TestPayButtonFollowsPaymentURL: when the order carries paymentUrl (the
// shop takes payments on its own page), the pay button sends the shopper
// there and never calls the simulated pay.
func TestPayButtonFollowsPaymentURL(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale("Shop pays", time.Now().Add(-time.Second), 100, 3)
	var mu sync.Mutex
	var visits []string
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/checkout/") {
			http.NotFound(w, r) // the browser's favicon
			return
		}
		mu.Lock()
		visits = append(visits, r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, `<!doctype html><html lang="en"><title>Shop payment</title><h1>Pay</h1></html>`)
	}))
	t.Cleanup(shop.Close)
	proxy := newShopProxy(t, s)
	tmpl := shop.URL + "/checkout/{orderId}"
	proxy.paymentURL.Store(&tmpl)

	b := newBrowser(t)
	tb := b.tab("")
	tb.navigate(s.shopperURL(proxy.URL, saleID, 6201, ""))
	tb.waitState("ADMITTED")
	clickBuy(tb, items[0])
	tb.do("order reserved", chromedp.WaitVisible(chromedp.CSS(`#result[data-result="RESERVED"]`)))
	tb.waitJS("payable at the shop", `!document.getElementById('pay').disabled && document.getElementById('pay').dataset.paymentUrl === 'shop'`)
	if got := tb.text("#pay"); got != "Pay on the shop’s payment page" {
		t.Errorf("#pay = %q, want it to say the shop's page", got)
	}
	orderID := tb.text("#order-id")
	tb.screenshot("pay-at-shop")
	tb.click("#pay")
	// The page is replaced by the shop's: read the address until it is
	// there (an evaluation may meet the old page going away).
	want := shop.URL + "/checkout/" + orderID
	var href string
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("the shop's page %q after pay (the browser is at %q)", want, href) }, waitFor, func() bool {
		ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
		defer cancel()
		href, _ = chromedp.Run(ctx, chromedp.Evaluate[string](`document.readyState === 'complete' ? location.href : ''`))
		return href == want
	})
	mu.Lock()
	got := strings.Join(visits, ",")
	mu.Unlock()
	if got != "/checkout/"+orderID {
		t.Errorf("shop saw %q, want /checkout/%s", got, orderID)
	}
	if n := proxy.simPays.Load(); n != 0 {
		t.Errorf("%d simulated pays sent, want 0", n)
	}
	if o := orderOf(s, 6201, saleID); o["status"] != "PENDING" {
		t.Errorf("order = %v, want still PENDING (the shop has not called back)", o)
	}
}
