package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/flashsale/flashsale/internal/wiring"
)

// axePath is axe-core as `npm ci` in static/ installs it (static/package.json
// pins the version).
const axePath = "../static/node_modules/axe-core/axe.min.js"

// loadAxe reads axe-core, skipping the test when it is not installed here
// (CI and `make test` run `npm ci` first, so there it fails instead).
func loadAxe(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(axePath)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("axe-core not installed (%v): CI must run `npm ci` in static/", err)
		}
		t.Skipf("axe-core not installed at %s: run `npm ci` in static/ to check accessibility (%v)", axePath, err)
	}
	return string(b)
}

// language sets the tab's preferred languages, as a browser set to them
// sends in Accept-Language and shows in navigator.languages. Call it
// before navigate.
func (tb *tab) language(acceptLanguage string) {
	tb.b.t.Helper()
	tb.do("language "+acceptLanguage, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		ua, err := chromedp.Run(ctx, chromedp.Evaluate[string](`navigator.userAgent`))
		if err != nil {
			return err
		}
		_, err = cdp.Call(ctx, t, emulation.SetUserAgentOverride, emulation.SetUserAgentOverrideParams{UserAgent: ua, AcceptLanguage: acceptLanguage})
		return err
	}))
}

type axeNode struct {
	Target  []any  `json:"target"`
	HTML    string `json:"html"`
	Summary string `json:"failureSummary"`
}

type axeViolation struct {
	ID      string    `json:"id"`
	Impact  string    `json:"impact"`
	Help    string    `json:"help"`
	HelpURL string    `json:"helpUrl"`
	Nodes   []axeNode `json:"nodes"`
}

// checkA11y runs axe-core over the page as it is now: a violation of impact
// serious or critical fails the test, the others are logged. The report is
// saved next to the screenshots.
func checkA11y(tb *tab, axe, state string) {
	tb.b.t.Helper()
	settle(tb)
	if !evalT[bool](tb, `typeof window.axe === 'object'`) {
		evalT[bool](tb, axe+"\n;true")
	}
	ctx, cancel := context.WithTimeout(tb.ctx, 2*waitFor)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`axe.run(document, {resultTypes: ['violations']}).then((r) => JSON.stringify(r.violations))`, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.fail("axe "+state, err)
	}
	var vs []axeViolation
	if err := json.Unmarshal([]byte(raw), &vs); err != nil {
		tb.b.t.Fatalf("axe %s: %v", state, err)
	}
	lang := evalT[string](tb, `document.documentElement.lang`)
	p := filepath.Join(tb.b.dir, sanitize(state+"-"+lang)+".axe.json")
	if err := os.WriteFile(p, []byte(raw), 0o644); err != nil {
		tb.b.t.Errorf("write %s: %v", p, err)
	}
	tb.screenshot(sanitize(state + "-" + lang))
	for _, v := range vs {
		var where []string
		for _, n := range v.Nodes {
			where = append(where, fmt.Sprint(n.Target)+" "+n.HTML)
		}
		msg := fmt.Sprintf("%s%s [%s]: %s %s (%s)\n  %s", tb.label(), state+"/"+lang, v.Impact, v.ID, v.Help, v.HelpURL, strings.Join(where, "\n  "))
		if v.Impact == "serious" || v.Impact == "critical" {
			tb.b.t.Errorf("accessibility violation: %s", msg)
		} else {
			tb.b.t.Logf("accessibility note: %s", msg)
		}
	}
}

// untranslated lists the texts and labels on the page that are English
// catalogue texts with a different Spanish one: on a Spanish page, each is
// a text left out of the catalogues.
const untranslated = `(async () => {
  const links = [...document.querySelectorAll('link[rel=modulepreload]')].map((l) => l.href);
  const es = links.find((h) => /\/lang-es\./.test(h));
  const en = links.find((h) => /\/lang-en\./.test(h));
  const E = (await import(en)).default, S = (await import(es)).default;
  const flat = (v) => (v && typeof v === 'object' ? Object.values(v) : [v]);
  const spanish = new Set(Object.values(S).flatMap(flat));
  const english = new Set();
  for (const [k, v] of Object.entries(E)) for (const x of flat(v)) if (!spanish.has(x) && !/\{/.test(x)) english.add(x.trim());
  const found = [];
  const visible = (el) => !el.closest('[hidden]') && !(el.closest('details:not([open])') && !el.closest('summary'));
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const txt = n.textContent.trim();
    if (txt && english.has(txt) && visible(n.parentElement)) found.push(txt);
  }
  for (const el of document.querySelectorAll('[aria-label],[title],[alt],[placeholder]')) {
    for (const a of ['aria-label', 'title', 'alt', 'placeholder']) {
      const v = (el.getAttribute(a) || '').trim();
      if (v && english.has(v)) found.push(a + '=' + v);
    }
  }
  if (english.has(document.title.trim())) found.push('title=' + document.title);
  return JSON.stringify(found);
})()`

// checkSpanish fails the test for every English text left on a Spanish page.
func checkSpanish(tb *tab, state string) {
	tb.b.t.Helper()
	if lang := evalT[string](tb, `document.documentElement.lang`); lang != "es" {
		tb.b.t.Fatalf("%s%s: <html lang> = %q, want es", tb.label(), state, lang)
	}
	ctx, cancel := context.WithTimeout(tb.ctx, waitFor)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](untranslated, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.fail("untranslated "+state, err)
	}
	var found []string
	if err := json.Unmarshal([]byte(raw), &found); err != nil {
		tb.b.t.Fatal(err)
	}
	if len(found) > 0 {
		tb.b.t.Errorf("%s%s: English left on the Spanish page: %q", tb.label(), state, found)
	}
}

// checkPage runs the accessibility check and, on a Spanish page, the
// untranslated-text check.
func checkPage(tb *tab, axe, state string) {
	tb.b.t.Helper()
	checkA11y(tb, axe, state)
	if evalT[string](tb, `document.documentElement.lang`) == "es" {
		checkSpanish(tb, state)
	}
}

// TestAccessibility runs axe-core over the shopper page in every state
// (waiting, admitted, order, paid, paused, sold out) and over the operator
// console and its report view, in English and in Spanish.
func TestAccessibility(t *testing.T) {
	t.Parallel() // long, and waits on nothing another test holds (browser_test.go)
	axe := loadAxe(t)
	// Capacity factor 1 keeps a shopper waiting behind an admitted one.
	s := startStack(t, func(c *wiring.Config) { c.CapacityFactor = 1 })
	b := newBrowser(t)
	for i, lang := range []string{"en-US,en", "es-ES,es"} {
		base := int64(20000 + 1000*i)
		t.Run(strings.SplitN(lang, ",", 2)[1], func(t *testing.T) {
			// Waiting, then sold out: one unit, held by an admitted buyer.
			last, lastItems := s.createSale("Last one", time.Now().Add(-time.Second), 1, 1)
			at := s.admit(base+1, last)
			w := b.tab("waiting-" + lang)
			w.language(lang)
			w.navigate(s.shopperURL(s.App.PublicURL, last, base+2, ""))
			w.waitState("WAITING")
			checkPage(w, axe, "waiting")
			s.buy(base+1, lastItems[0], at)
			w.waitState("SOLD_OUT")
			w.waitJS("sold out shown", `document.getElementById('sale-banner').dataset.state === 'SOLD_OUT'`)
			checkPage(w, axe, "sold-out")

			// Admitted, order, paid.
			drop, dropItems := s.createSaleItems("Winter drop", time.Now().Add(-time.Second), 100,
				map[string]any{"productId": 501, "quantity": 5, "priceCents": 8999, "currency": "EUR", "name": "Trail runner", "imageUrl": "/assets/sneaker.svg"},
				map[string]any{"productId": 502, "quantity": 5, "priceCents": 1999})
			a := b.tab("buyer-" + lang)
			a.language(lang)
			a.navigate(s.shopperURL(s.App.PublicURL, drop, base+3, ""))
			a.waitState("ADMITTED")
			buy := fmt.Sprintf("#buy-%d", dropItems[0])
			a.do("buy button", chromedp.WaitVisible(chromedp.CSS(buy)), chromedp.WaitEnabled(chromedp.CSS(buy)))
			checkPage(a, axe, "admitted")
			clickBuy(a, dropItems[0])
			a.waitJS("order payable", `document.getElementById('order-status').dataset.status === 'PENDING' && !document.getElementById('pay').disabled`)
			checkPage(a, axe, "order")
			a.do("click pay", chromedp.Click(chromedp.CSS("#pay")))
			a.do("order paid", chromedp.WaitVisible(chromedp.CSS(`#order-status[data-status="PAID"]`)))
			checkPage(a, axe, "paid")

			// Paused: an admitted shopper of a paused sale.
			p := b.tab("paused-" + lang)
			p.language(lang)
			p.navigate(s.shopperURL(s.App.PublicURL, drop, base+4, ""))
			p.waitState("ADMITTED")
			p.do("buy button", chromedp.WaitVisible(chromedp.CSS(buy)), chromedp.WaitEnabled(chromedp.CSS(buy)))
			s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/pause", drop), s.Token(1, true), nil), 200, "")
			// An admitted shopper hears of the pause from its sale data (a
			// refresh may come at any moment, and takes the buy button
			// away) or from a refused purchase, whichever is first: click
			// buy while there is a button, until the page shows the pause.
			p.waitJS("page paused", `(() => {
				const b = document.querySelector('`+buy+`');
				if (b && !b.disabled) b.click();
				return document.getElementById('sale-banner').dataset.state === 'PAUSED';
			})()`)
			checkPage(p, axe, "paused")

			// The console, with a sale chosen.
			op := b.tab("operator-" + lang)
			op.language(lang)
			op.navigate(s.operatorURL(drop))
			op.do("figures", chromedp.WaitVisible(chromedp.CSS("#figures-body")))
			op.waitJS("items and audit", `document.querySelectorAll('#fig-items tr').length === 2 && document.querySelectorAll('#audit-list li').length > 0`)
			checkPage(op, axe, "operator")

			// The report after the drop of the same sale: its charts and
			// tables drawn (the room's figures come with the gateway's
			// next roll-up write).
			op.navigate(s.reportURL(drop))
			op.waitJS("report drawn", `document.querySelectorAll('#report-charts svg').length === 4 &&
			  !['', '0'].includes(document.getElementById('rep-paid').textContent.trim()) && document.querySelectorAll('#report-minutes tr').length > 0`)
			checkPage(op, axe, "report")
		})
	}
}
