package browsertest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestAccessCodePage: the shopper page of a codes sale, in English and
// Spanish. A shopper without a binding is told the sale needs a code and
// shown the code field; a wrong code is refused in words; the right one
// (typed in lower case) joins. On a reload the shopper joins again
// without the code, which stays hidden. The page with the field is
// axe-clean. The console of the sale shows its rule, generates codes,
// changes the rule to an allowlist and uploads one from a CSV file.
func TestAccessCodePage(t *testing.T) {
	t.Parallel() // waits on pages only (browser_test.go)
	axe := loadAxe(t)
	s := startStack(t)
	b := newBrowser(t)
	for i, lang := range []string{"en-US,en", "es-ES,es"} {
		base := int64(40000 + 1000*i)
		t.Run(strings.SplitN(lang, ",", 2)[1], func(t *testing.T) {
			c := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
				"name": "Presale", "startsAt": time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "admissionRatePerSecond": 100,
				"access": map[string]any{"rule": "codes", "tiers": []map[string]any{{"tier": 1}, {"tier": 2, "joinFrom": time.Now().Add(30 * time.Minute).UTC().Format(time.RFC3339)}}},
				"items":  []map[string]any{{"productId": 501, "quantity": 5, "priceCents": 1999}},
			})
			s.Want(c, 201, "")
			sale := int64(c.Body["id"].(float64))
			r := s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/codes", sale), s.Token(1, true), map[string]any{"count": 1})
			s.Want(r, 201, "")
			code := r.Body["codes"].([]any)[0].(map[string]any)["code"].(string)

			p := b.tab("code-" + lang)
			p.language(lang)
			url := s.shopperURL(s.App.PublicURL, sale, base+1, "")
			p.navigate(url)
			p.waitJS("refused NOT_INVITED", `document.getElementById('error').dataset.error === 'NOT_INVITED' && !document.getElementById('code-box').hidden`)
			checkPage(p, axe, "code-needed")
			p.typeInto("#invite-code", "WRONGCODE99")
			p.click("#join")
			p.waitJS("refused CODE_INVALID", `document.getElementById('error').dataset.error === 'CODE_INVALID' && !document.getElementById('code-box').hidden`)
			evalT[string](p, `document.getElementById('invite-code').value = ''`)
			p.typeInto("#invite-code", strings.ToLower(code))
			p.click("#join")
			p.waitState("PREQUEUE")
			p.waitJS("code field hidden", `document.getElementById('code-box').hidden`)

			// A reload joins without the code (the binding).
			p.navigate("about:blank")
			p.navigate(url)
			p.waitState("PREQUEUE")
			if !evalT[bool](p, `document.getElementById('code-box').hidden`) {
				t.Error("the code field shows for a shopper whose code is bound")
			}

			// A tier-2 code before its tier's start: refused, and told when
			// in the page's language, the code not spent.
			r = s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/codes", sale), s.Token(1, true), map[string]any{"count": 1, "tier": 2})
			s.Want(r, 201, "")
			early := r.Body["codes"].([]any)[0].(map[string]any)["code"].(string)
			q := b.tab("tier-" + lang)
			q.language(lang)
			q.navigate(s.shopperURL(s.App.PublicURL, sale, base+3, ""))
			q.waitJS("refused NOT_INVITED", `document.getElementById('error').dataset.error === 'NOT_INVITED'`)
			q.typeInto("#invite-code", early)
			q.click("#join")
			// The generic NOT_YET text has no digits; this one names the
			// tier and its start's time of day.
			q.waitJS("refused NOT_YET with the tier and its start", `document.getElementById('error').dataset.error === 'NOT_YET' && /2/.test(document.getElementById('error').textContent) && /\d:\d\d/.test(document.getElementById('error').textContent)`)
			codes := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d/codes", sale), s.Token(1, true), nil)
			s.Want(codes, 200, "")
			found := false
			for _, x := range codes.Body["codes"].([]any) {
				if c := x.(map[string]any); c["code"] == early {
					found = true
					if c["used"] != float64(0) {
						t.Errorf("the tier-2 code refused NOT_YET was spent: %v", c)
					}
				}
			}
			if !found {
				t.Errorf("the tier-2 code %s is not among the sale's codes: %v", early, codes.Body)
			}

			// The console shows the rule and makes codes.
			op := b.tab("op-access-" + lang)
			op.language(lang)
			op.navigate(s.operatorURL(sale))
			op.do("figures", chromedp.WaitVisible(chromedp.CSS("#figures-body")))
			op.waitJS("the rule shown", `document.getElementById('acc-rule').value === 'codes' && document.getElementById('acc-current').textContent !== ''`)
			evalT[string](op, `document.getElementById('codes-count').value = '5'`)
			op.click("#codes-generate")
			op.waitJS("codes made", `/5/.test(document.getElementById('acc-result').textContent)`)
			checkPage(op, axe, "operator-access")

			// The rule becomes an allowlist, and a CSV file is uploaded.
			// As a hand does it (a change event): the figures' refresh,
			// every second, leaves a changed field alone until it is
			// applied.
			evalT[bool](op, `(() => { const el = document.getElementById('acc-rule'); el.value = 'allowlist'; return el.dispatchEvent(new Event('change')); })()`)
			op.click("#acc-draw") // and the draw puts tier 1 first
			op.click("#acc-apply")
			op.waitJS("the allowlist rule", `document.getElementById('acc-current').textContent.includes(document.querySelector('#acc-rule option[value=allowlist]').textContent)`)
			op.waitJS("the draw by tier shown", `document.getElementById('acc-draw').checked && document.getElementById('acc-current').textContent.split(';').length > 1`)
			got := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d", sale), "", nil)
			s.Want(got, 200, "")
			if a, _ := got.Body["access"].(map[string]any); a == nil || a["rule"] != "allowlist" || a["drawByTier"] != true {
				t.Fatalf("the sale's access after the console's change: %v, want an allowlist drawn by tier", got.Body["access"])
			}
			csvFile := filepath.Join(t.TempDir(), "members.csv")
			if err := os.WriteFile(csvFile, []byte("userId,tier\n"+fmt.Sprint(base+7)+"\n"+fmt.Sprint(base+8)+",2\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			op.do("choose the file", chromedp.SetUploadFiles(chromedp.CSS("#allowlist-file"), []string{csvFile}))
			op.click("#allowlist-upload")
			op.waitJS("two users listed", `/2/.test(document.getElementById('acc-result').textContent)`)
			s.Want(s.Do("POST", queuePath(sale), s.Token(base+8, false), nil), 200, "")
			s.Want(s.Do("POST", queuePath(sale), s.Token(base+9, false), nil), 403, "NOT_INVITED")
		})
	}
}
