package browsertest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// typeInto focuses a field and types text as a person does (key events:
// the console notices an edit began).
func (tb *tab) typeInto(sel, text string) {
	tb.b.t.Helper()
	tb.do("type into "+sel, chromedp.Focus(chromedp.CSS(sel)), chromedp.SendKeys(chromedp.CSS(sel), text))
}

func (tb *tab) click(sel string) {
	tb.b.t.Helper()
	tb.do("click "+sel, chromedp.WaitEnabled(chromedp.CSS(sel)), chromedp.Click(chromedp.CSS(sel)))
}

// TestOperatorKillSwitchAndConflict drives the console's kill switch (pause,
// resume, end with its confirmation, stock, message) and shows that two
// consoles never overwrite each other: a write made on what one console
// read, after the other changed it, shows the conflict and changes nothing;
// a reload shows the current values and the write then goes through. The
// same for the bot-defense settings.
func TestOperatorKillSwitchAndConflict(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale("Console drop", time.Now().Add(-time.Second), 50, 10, 4)
	b := newBrowser(t)
	a := b.tab("")
	a.navigate(s.operatorURL(saleID))
	a.do("console A", chromedp.WaitVisible(chromedp.CSS("#figures-body")))
	a.waitJS("version shown", `document.getElementById('fig-version').textContent.trim() === '1'`)
	other := b.tab("operator-B")
	other.navigate(s.operatorURL(saleID))
	other.do("console B", chromedp.WaitVisible(chromedp.CSS("#figures-body")))
	other.waitJS("version shown", `document.getElementById('fig-version').textContent.trim() === '1'`)

	// Pause from A.
	a.click("#ctl-pause")
	a.waitJS("pause reported", `document.getElementById('change-result').textContent.startsWith('Sale paused.')`)
	a.waitJS("state PAUSED", `document.getElementById('fig-state').dataset.state === 'PAUSED'`)
	if got := s.adminSale(saleID)["state"]; got != "PAUSED" {
		t.Fatalf("after pause, state = %v, want PAUSED", got)
	}
	if !evalT[bool](a, `document.getElementById('ctl-pause').disabled && !document.getElementById('ctl-resume').disabled`) {
		t.Error("while paused, pause should be disabled and resume enabled")
	}

	// A starts writing a message on the paused sale; B resumes meanwhile.
	a.waitJS("version 2", `document.getElementById('fig-version').textContent.trim() === '2'`)
	a.typeInto("#message-text", "Back in five minutes")
	other.waitJS("B sees PAUSED", `document.getElementById('fig-state').dataset.state === 'PAUSED'`)
	other.click("#ctl-resume")
	other.waitJS("resume reported", `document.getElementById('change-result').textContent.startsWith('Sale resumed.')`)
	a.waitJS("A's figures follow", `document.getElementById('fig-state').dataset.state === 'OPEN'`)
	a.click("#message-apply")
	a.do("conflict shown", chromedp.WaitVisible(chromedp.CSS(`#conflict[data-kind="sale"]`)))
	a.screenshot("sale-conflict")
	conflict := a.text("#conflict")
	for _, want := range []string{"version 2 → 3", "state: paused → open"} {
		if !strings.Contains(conflict, want) {
			t.Errorf("conflict display %q lacks %q", conflict, want)
		}
	}
	sale := s.adminSale(saleID)
	if sale["message"] != nil || sale["version"] != float64(3) {
		t.Fatalf("after the refused write, message = %v version = %v; want none and 3", sale["message"], sale["version"])
	}
	// Reload, then the same message goes through.
	a.click("#conflict-reload")
	a.waitJS("conflict gone", `document.getElementById('conflict').hidden`)
	a.typeInto("#message-text", "Back in five minutes")
	a.click("#message-apply")
	a.waitJS("message reported with its audit entry", `document.getElementById('change-result').textContent.includes('Message sent') && document.getElementById('change-result').textContent.includes('Audit #')`)
	if m, _ := s.adminSale(saleID)["message"].(map[string]any); m == nil || m["text"] != "Back in five minutes" {
		t.Fatalf("message after the write = %v", s.adminSale(saleID)["message"])
	}

	// Add stock to the second item.
	a.do("choose item", chromedp.SetValue(chromedp.CSS("#stock-item"), fmt.Sprint(items[1])))
	a.typeInto("#stock-add", "6")
	a.click("#stock-apply")
	a.waitJS("stock reported", `document.getElementById('change-result').textContent.startsWith('6 units added to item #`+fmt.Sprint(items[1])+`.')`)
	for _, it := range s.adminSale(saleID)["items"].([]any) {
		it := it.(map[string]any)
		if int64(it["id"].(float64)) == items[1] && it["quantity"] != float64(10) {
			t.Errorf("item %d quantity = %v after adding 6 to 4, want 10", items[1], it["quantity"])
		}
	}
	// Bad input is refused in the page and changes nothing.
	a.do("clear stock", chromedp.SetValue(chromedp.CSS("#stock-add"), "0"))
	// The browser's own check (min=1) would stop a click; the console's
	// check is behind it.
	evalT[bool](a, `document.getElementById('stock-form').dispatchEvent(new Event('submit', {cancelable: true}))`)
	a.waitJS("bad stock refused", `document.getElementById('change-result').textContent.startsWith('Add a whole number')`)

	// End: asks first; "no" keeps the sale open.
	a.click("#ctl-end")
	a.do("confirmation", chromedp.WaitVisible(chromedp.CSS("#end-confirm")))
	a.screenshot("end-confirm")
	a.click("#ctl-end-no")
	a.waitJS("confirmation closed", `document.getElementById('end-confirm').hidden`)
	if got := s.adminSale(saleID)["state"]; got != "OPEN" {
		t.Fatalf("after declining, state = %v, want OPEN", got)
	}
	a.click("#ctl-end")
	a.click("#ctl-end-yes")
	a.waitJS("state ENDED", `document.getElementById('fig-state').dataset.state === 'ENDED'`)
	if got := s.adminSale(saleID)["state"]; got != "ENDED" {
		t.Fatalf("after ending, state = %v, want ENDED", got)
	}

	// Settings: B blocks a user; A, still on the settings it read, sets the
	// proof-of-work difficulty: refused, shown, nothing changed.
	a.waitJS("settings read", `document.getElementById('settings-version').textContent.trim() !== '–'`)
	other.do("B blocks", chromedp.SetValue(chromedp.CSS("#block-user-input"), "777"), chromedp.Click(chromedp.CSS("#block-user-apply")))
	other.waitJS("block reported", `document.getElementById('change-result').textContent.includes('User 777 blocked.')`)
	before := s.Do("GET", "/api/admin/settings", s.Token(1, true), nil)
	s.Want(before, 200, "")
	a.do("A sets difficulty", chromedp.SetValue(chromedp.CSS("#pow-difficulty"), "4096"), chromedp.Click(chromedp.CSS("#pow-apply")))
	a.do("settings conflict", chromedp.WaitVisible(chromedp.CSS(`#conflict[data-kind="settings"]`)))
	a.screenshot("settings-conflict")
	if got := a.text("#conflict-changes"); !strings.Contains(got, "777") {
		t.Errorf("settings conflict %q does not show the blocked user", got)
	}
	after := s.Do("GET", "/api/admin/settings", s.Token(1, true), nil)
	if after.Body["version"] != before.Body["version"] || fmt.Sprint(after.Body["pow"]) != fmt.Sprint(before.Body["pow"]) {
		t.Fatalf("the refused settings write changed them: before %v, after %v", before.Raw, after.Raw)
	}
	a.click("#conflict-reload")
	a.waitJS("blocked user shown after reload", `document.getElementById('block-users').textContent.includes('777')`)
	a.do("A sets difficulty again", chromedp.SetValue(chromedp.CSS("#pow-difficulty"), "4096"), chromedp.Click(chromedp.CSS("#pow-apply")))
	a.waitJS("difficulty reported", `document.getElementById('change-result').textContent.includes('Proof-of-work difficulty set to 4,096')`)
	final := s.Do("GET", "/api/admin/settings", s.Token(1, true), nil)
	if users := fmt.Sprint(final.Body["blocklist"]); !strings.Contains(users, "777") {
		t.Errorf("B's block was overwritten: %s", final.Raw)
	}
}

// TestOperatorCreatesSaleWithItemDetails: the console's create form sends
// each item's name, image and currency; a value the server refuses is
// shown with the field it names, and nothing is created.
func TestOperatorCreatesSaleWithItemDetails(t *testing.T) {
	s := startStack(t)
	b := newBrowser(t)
	op := b.tab("")
	op.navigate(fmt.Sprintf("%s/operator#token=%s", s.App.PublicURL, s.Token(1, true)))
	op.do("console", chromedp.WaitVisible(chromedp.CSS("#create-sale")))
	// Each label of the item rows and the bot-defense forms sits right
	// above its own input, on a narrow window too, where the rows wrap (the
	// labels once sat beside the previous field's input: "Product [501]
	// Quantity / [100] Price (cents)").
	for _, width := range []int64{1280, 480} {
		op.do("resize", chromedp.EmulateViewport(width, 900))
		bad := evalT[string](op, `(() => {
			for (const l of document.querySelectorAll('#cs-items label, #knobs form label, #stock-form label, #rate-form label')) {
				if (!l.offsetParent) continue; // not shown (no sale chosen yet)
				const i = document.getElementById(l.htmlFor);
				if (!i) return 'no input for ' + l.textContent;
				const lr = l.getBoundingClientRect(), ir = i.getBoundingClientRect();
				if (Math.abs(lr.left - ir.left) > 2 || lr.bottom > ir.top + 1 || ir.top - lr.bottom > 12) {
					return l.textContent + ': label at ' + [lr.left, lr.bottom] + ', input at ' + [ir.left, ir.top];
				}
			}
			return '';
		})()`)
		if bad != "" {
			t.Errorf("window %d px wide: %s", width, bad)
		}
	}
	// Each label names its own input: it is the input's one label, and a
	// click on it focuses that input, in a second item's group too.
	op.click("#cs-add-item")
	for _, id := range evalT[[]string](op, `[...document.querySelectorAll('#create-sale label')].map((l) => l.htmlFor)`) {
		if !evalT[bool](op, fmt.Sprintf(`(() => { const i = document.getElementById(%q); return !!i && i.labels.length === 1 && i.labels[0].htmlFor === i.id; })()`, id)) {
			t.Errorf("#%s is not named by its own one label", id)
		}
		op.click(fmt.Sprintf("label[for=%q]", id))
		if got := evalT[string](op, `document.activeElement.id`); got != id {
			t.Errorf("a click on the label of #%s focused #%s", id, got)
		}
	}
	if got := op.text("#cs-items .item-row:last-child legend"); got != "Item 2" {
		t.Errorf("second item's group legend = %q, want Item 2", got)
	}
	op.click(`#cs-items [data-remove-n="2"]`)
	op.screenshot("create-sale-items")
	fill := func(image string) {
		op.do("fill the form",
			chromedp.SetValue(chromedp.CSS("#cs-name"), "Console drop"),
			chromedp.SetValue(chromedp.CSS("#cs-name-1"), "Trail runner Aurora"),
			chromedp.SetValue(chromedp.CSS("#cs-currency-1"), "GBP"),
			chromedp.SetValue(chromedp.CSS("#cs-imageUrl-1"), image),
			chromedp.SetValue(chromedp.CSS("#cs-priceCents-1"), "4599"),
		)
	}
	fill("ftp://images.example/aurora.png")
	op.click("#cs-submit")
	op.waitJS("refusal shown", `document.getElementById('create-result').textContent.startsWith('Not created: the server refused a value: items[0].imageUrl')`)
	r := s.Do("GET", "/api/admin/sales", s.Token(1, true), nil)
	s.Want(r, 200, "")
	if strings.Contains(string(r.Raw), "Console drop") {
		t.Fatalf("a refused sale was created: %s", r.Raw)
	}
	fill("/assets/sneaker.svg")
	op.click("#cs-submit")
	op.waitJS("created", `document.getElementById('create-result').textContent.startsWith('Created sale #')`)
	op.waitJS("figures of the new sale", `document.querySelector('#fig-items th')?.textContent.includes('Trail runner Aurora (£45.99)')`)
	var saleID int64
	if _, err := fmt.Sscanf(op.text("#create-result"), "Created sale #%d", &saleID); err != nil {
		t.Fatalf("create result %q: %v", op.text("#create-result"), err)
	}
	it := s.adminSale(saleID)["items"].([]any)[0].(map[string]any)
	if it["name"] != "Trail runner Aurora" || it["currency"] != "GBP" || it["imageUrl"] != "/assets/sneaker.svg" || it["priceCents"] != float64(4599) {
		t.Errorf("created item = %v", it)
	}
}
