package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/push"
	"github.com/flashsale/flashsale/push/pushtest"
)

// pushStub replaces PushManager.prototype.subscribe, the one step a
// headless Chromium without a push service cannot take: it records the
// application server key the page asked with and the service workers
// registered by then, and answers the subscription the test's local push
// service made (window.__pushSub, set by the test before the click).
const pushStub = `(() => {
  if (typeof PushManager === 'undefined') return;
  window.__push = { calls: 0 };
  PushManager.prototype.subscribe = async function (opts) {
    const key = new Uint8Array(opts.applicationServerKey);
    let s = '';
    for (const b of key) s += String.fromCharCode(b);
    window.__push.key = btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
    window.__push.userVisibleOnly = opts.userVisibleOnly;
    const regs = await navigator.serviceWorker.getRegistrations();
    window.__push.workers = regs.filter((r) => r.active).map((r) => r.active.scriptURL);
    window.__push.calls++;
    const sub = window.__pushSub;
    return { endpoint: sub.endpoint, toJSON: () => sub };
  };
})();`

// TestTurnNotificationSubscribe: the waiting page offers the turn
// notification, registers its service worker, subscribes with the
// operator's VAPID key and hands the subscription to the API; at the
// shopper's turn the leader's notification reaches the (local) push
// service, which decrypts it. Only the browser's own push service, which
// a headless Chromium lacks, is left out.
func TestTurnNotificationSubscribe(t *testing.T) {
	t.Parallel() // mostly waits on real windows (browser_test.go)
	pub, priv, err := push.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	svc := pushtest.New(t, pub)
	s := startStack(t, func(c *wiring.Config) {
		c.PushPublicKey, c.PushPrivateKey, c.PushSubject = pub, priv, "mailto:ops@shop.example"
		c.PushInsecureHosts = "127.0.0.1"
	})
	// The shopper subscribes before the opening: a subscription after
	// the turn rightly gets nothing. The opening leaves time for the
	// accessibility check of the page with its button on.
	opensAt := time.Now().Add(35 * time.Second)
	saleID, _ := s.createSale("Notify drop", opensAt, 1000, 5)

	b := newBrowser(t)
	tb := b.tab("")
	tb.do("grant notifications and stub the push service", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		for _, name := range []string{"notifications", "push"} {
			if _, err := cdp.Call(ctx, tg, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
				Permission: &cdpbrowser.PermissionDescriptor{Name: name, UserVisibleOnly: true},
				Setting:    cdpbrowser.PermissionSettingGranted, Origin: s.App.PublicURL,
			}); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: pushStub})
		return err
	}))
	const user = 7101
	tb.navigate(s.shopperURL(s.App.PublicURL, saleID, user, ""))
	tb.waitState("PREQUEUE")
	tb.waitJS("the notify button", `!document.getElementById('notify').hidden`)
	checkA11y(tb, loadAxe(t), "turn-notify")
	sub := svc.Subscribe("/browser")
	tb.do("hand the page a subscription", chromedp.Evaluate[chromedp.Void]("window.__pushSub = "+string(sub)+";"))
	tb.click("#notify")
	tb.waitJS("the subscription kept", `document.getElementById('notify').hidden && document.getElementById('notify-note').textContent.length > 0`)

	var rec struct {
		Calls           int
		Key             string
		UserVisibleOnly bool
		Workers         []string
	}
	if err := json.Unmarshal([]byte(evalT[string](tb, `JSON.stringify(window.__push)`)), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Calls != 1 || rec.Key != pub || !rec.UserVisibleOnly {
		t.Errorf("subscribe called %d times with key %q, userVisibleOnly %v; want once with %q, true", rec.Calls, rec.Key, rec.UserVisibleOnly, pub)
	}
	if len(rec.Workers) != 1 {
		t.Errorf("active service workers %q, want the page's one", rec.Workers)
	}
	if note := tb.text("#notify-note"); !strings.Contains(note, "notification when it is your turn") {
		t.Errorf("note %q, want the one that says the notification is on", note)
	}

	// At the opening the cursor passes the shopper: the notification
	// reaches the push service. The wait counts from the opening, which
	// on a slow machine may still be most of the 35 s away.
	select {
	case n := <-svc.Received:
		var got push.Notice
		if err := json.Unmarshal(n.Payload, &got); err != nil {
			t.Fatalf("payload %q: %v", n.Payload, err)
		}
		if n.Path != "/browser" || got.SaleID != saleID || got.URL != "/sales/"+strconv.FormatInt(saleID, 10) {
			t.Errorf("notification %s %+v, want /browser for sale %d", n.Path, got, saleID)
		}
	case <-time.After(time.Until(opensAt) + waitFor):
		t.Fatalf("no notification; the push service refused: %v", svc.Err())
	}
	tb.waitState("ADMITTED")
	if !evalT[bool](tb, `document.getElementById('notify').hidden`) {
		t.Error("the notify button is still offered after admission")
	}
}
