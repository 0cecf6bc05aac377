package browsertest

import (
	"fmt"
	"testing"
	"time"
)

// reportURL is the operator console's report view of a sale, signed in
// through the fragment.
func (s *stack) reportURL(saleID int64) string {
	return fmt.Sprintf("%s/operator?sale=%d&view=report#token=%s", s.App.PublicURL, saleID, s.Token(1, true))
}

// reportShown is true once the report view shows the figures of
// TestReportPage's sale: four shoppers joined and admitted, four units
// sold, one paid (a quarter of the orders), a measured wait, the four
// charts with their eight lines and a text alternative with figures each,
// and the tables filled.
const reportShown = `(() => {
  const txt = (id) => document.getElementById(id).textContent.trim();
  const charts = [...document.querySelectorAll('#report-charts svg')];
  return txt('rep-joined') === '4' && txt('rep-admitted') === '4' && txt('rep-sold') === '4' && txt('rep-paid') === '1' &&
    txt('rep-conversion').startsWith('25') && txt('rep-p50') !== '–' && txt('rep-p99') !== '–' &&
    charts.length === 4 && document.querySelectorAll('#report-charts svg path').length === 8 &&
    charts.every((c) => /\d/.test(c.getAttribute('aria-label') || '')) &&
    document.querySelectorAll('#report-statuses tr').length === 6 && document.querySelectorAll('#report-minutes tr').length > 0 &&
    document.getElementById('report-status').dataset.final === 'false';
})()`

// TestReportPage opens the report after the drop of a sale in English and
// in Spanish: the figures, the charts and their text alternatives, the
// tables, in the page's language; the report turns final once the sale
// ends.
func TestReportPage(t *testing.T) {
	t.Parallel() // waits for the gateways' roll-up (every 5 s)
	s := startStack(t)
	sale, items := s.createSale("Report drop", time.Now().Add(-time.Second), 100, 5, 5)
	// Three shoppers buy item A by the polling API; a fourth, on the page
	// (admitted over its WebSocket: a measured wait), buys item B and pays.
	for u := int64(9101); u <= 9103; u++ {
		s.buy(u, items[0], s.admit(u, sale))
	}
	b := newBrowser(t)
	shop := b.tab("shopper")
	shop.navigate(s.shopperURL(s.App.PublicURL, sale, 9104, ""))
	shop.waitState("ADMITTED")
	buyAndPay(shop, items[1])

	for _, lang := range []string{"en", "es"} {
		op := b.tab("report-" + lang)
		op.language(lang)
		op.navigate(s.reportURL(sale))
		op.waitJS("language "+lang, fmt.Sprintf(`document.documentElement.lang === %q`, lang))
		op.waitJS("the report's figures", reportShown)
		title := map[string]string{"en": "Report after the drop", "es": "Informe tras la venta"}[lang]
		if got := op.text("#report-title"); got != title+" · #"+fmt.Sprint(sale)+" Report drop" {
			t.Errorf("%s title = %q", lang, got)
		}
		// The other parts of the console are not shown in the report view.
		if evalT[bool](op, `getComputedStyle(document.getElementById('figures')).display !== 'none'`) {
			t.Errorf("%s: the live figures show in the report view", lang)
		}
		if lang == "es" {
			checkSpanish(op, "report")
		}
		op.screenshot("report")
	}

	// The end makes the report final.
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/end", sale), s.Token(1, true), nil), 200, "")
	op := b.tab("report-final")
	op.navigate(s.reportURL(sale))
	op.waitJS("the final report", `document.getElementById('report-status').dataset.final === 'true' &&
	  document.getElementById('rep-joined').textContent.trim() === '4'`)
}
