package browsertest

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

const defaultChromium = "/usr/bin/chromium"

// waitFor bounds every wait for something the page should show.
//
// Tests that mostly wait on real windows (a claim window, an opening far
// enough ahead for the accessibility check), and the two longest (the
// accessibility and screenshot tours, which time nothing), call
// t.Parallel: each has its own stack and browser, and they overlap. A
// test that times a page against the opening instant stays serial.
const waitFor = 30 * time.Second

// recorder is injected in every document before the page's own scripts. It
// keeps the history of the queue state and of the transport (a state can
// pass faster than a poll from the test), and counts WebSocket connects.
const recorder = `(() => {
  const fs = window.__fs = {states: [], transports: [], wsCreated: 0, wsOpened: 0};
  const W = window.WebSocket;
  if (typeof W === 'function') {
    const Wrapped = function (...args) {
      fs.wsCreated++;
      const ws = new W(...args);
      ws.addEventListener('open', () => fs.wsOpened++);
      return ws;
    };
    Wrapped.prototype = W.prototype;
    for (const k of ['CONNECTING', 'OPEN', 'CLOSING', 'CLOSED']) Wrapped[k] = W[k];
    window.WebSocket = Wrapped;
  }
  const push = (list, v) => { if (v && list[list.length - 1] !== v) list.push(v); };
  const rec = () => {
    const q = document.getElementById('queue-state');
    if (q) push(fs.states, q.dataset.state);
    const t = document.getElementById('transport');
    if (t) push(fs.transports, t.dataset.transport);
  };
  document.addEventListener('DOMContentLoaded', () => {
    rec();
    new MutationObserver(rec).observe(document.documentElement,
      {subtree: true, attributes: true, attributeFilter: ['data-state', 'data-transport']});
  });
})();`

// browser is one headless Chromium for one test.
type browser struct {
	t   *testing.T
	ctx context.Context // the first tab; its first Run started the browser
	dir string          // artifacts of this test
}

func chromiumPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("FLASHSALE_CHROMIUM")
	if p == "" {
		p = defaultChromium
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("chromium not found at %s (CI must install it): %v", p, err)
		}
		t.Skipf("chromium not found at %s: %v", p, err)
	}
	return p
}

// newBrowser starts Chromium with the flags of DESIGN.md and a fresh profile.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	exe := chromiumPath(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		// The tests' https servers (a shop's picture server) have their
		// own certificates.
		chromedp.Flag("ignore-certificate-errors", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
		// The pages choose their language from the browser's; the tests
		// that check another language set it per tab (Accept-Language).
		chromedp.Flag("lang", "en-US"),
		chromedp.Flag("accept-lang", "en-US,en"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
	})
	// The first Run starts the browser; it must not carry a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	dir := filepath.Join("artifacts", sanitize(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &browser{t: t, ctx: ctx, dir: dir}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func sanitize(s string) string { return unsafeChars.ReplaceAllString(s, "_") }

// tab is one browser tab (its own sessionStorage, so its own sign-in).
type tab struct {
	b    *browser
	name string
	ctx  context.Context
	shot int
}

// tab opens a new tab; the first call uses the browser's first tab.
func (b *browser) tab(name string) *tab {
	b.t.Helper()
	ctx := b.ctx
	if name != "" {
		var cancel context.CancelFunc
		ctx, cancel = chromedp.NewContext(b.ctx)
		b.t.Cleanup(cancel)
		if err := chromedp.Do(ctx); err != nil {
			b.t.Fatalf("new tab %s: %v", name, err)
		}
	}
	tb := &tab{b: b, name: name, ctx: ctx}
	tb.do("install recorder", chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: recorder})
		return err
	}))
	return tb
}

// do runs actions with the common bound; a failure saves a screenshot and
// the page's state before failing the test.
func (tb *tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	tb.b.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, waitFor)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.fail(what, err)
	}
}

func (tb *tab) fail(what string, err error) {
	tb.b.t.Helper()
	tb.screenshot("FAILED-" + sanitize(what))
	tb.b.t.Fatalf("%s%s: %v\npage: %s", tb.label(), what, err, tb.describe())
}

func (tb *tab) label() string {
	if tb.name == "" {
		return ""
	}
	return "[" + tb.name + "] "
}

// describe is a short dump of the page's hooks for failure messages.
func (tb *tab) describe() string {
	ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify({
	  url: location.href,
	  history: window.__fs,
	  state: document.getElementById('queue-state')?.dataset.state,
	  error: document.getElementById('error')?.textContent,
	  result: document.getElementById('result')?.textContent,
	  order: document.getElementById('order-status')?.textContent,
	  transport: document.getElementById('transport')?.textContent,
	  change: document.getElementById('change-result')?.textContent,
	})`))
	if err != nil {
		return "(page not readable: " + err.Error() + ")"
	}
	return s
}

func (tb *tab) navigate(url string) {
	tb.b.t.Helper()
	tb.do("navigate "+strings.SplitN(url, "#", 2)[0], chromedp.Navigate(url))
}

// waitJS waits until the JavaScript predicate is true. A poll whose
// page context went away under it (the page navigated or was replaced
// while the poll ran: a reload's second document) is polled again in the
// new one, within the same bound.
func (tb *tab) waitJS(what, predicate string) {
	tb.b.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		ctx, cancel := context.WithDeadline(tb.ctx, deadline)
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](predicate, chromedp.WithPollingInterval(50*time.Millisecond),
			chromedp.WithPollingTimeout(time.Until(deadline))))
		cancel()
		if err == nil {
			return
		}
		if !contextGone(err) || time.Now().After(deadline) {
			tb.fail("wait for "+what, err)
			return
		}
	}
}

// contextGone reports whether err is the browser's answer to a script run
// in a page context that no longer exists.
func contextGone(err error) bool {
	m := err.Error()
	return strings.Contains(m, "Cannot find context with specified id") ||
		strings.Contains(m, "Execution context was destroyed") ||
		strings.Contains(m, "Inspected target navigated or closed")
}

// waitState waits until the queue has been in state (now or earlier: the
// recorder keeps the history).
func (tb *tab) waitState(state string) {
	tb.b.t.Helper()
	tb.waitJS("queue state "+state, fmt.Sprintf(`!!window.__fs && window.__fs.states.includes(%q)`, state))
}

// eval evaluates an expression.
func evalT[T any](tb *tab, expr string) T {
	tb.b.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, waitFor)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		tb.fail("evaluate "+expr, err)
	}
	return v
}

func (tb *tab) text(sel string) string {
	tb.b.t.Helper()
	return evalT[string](tb, fmt.Sprintf(`(document.querySelector(%q)?.textContent ?? '').trim()`, sel))
}

// screenshot saves the whole page as artifacts/<test>/NN-<tab>-<name>.png
// and returns the PNG.
func (tb *tab) screenshot(name string) []byte {
	tb.b.t.Helper()
	tb.shot++
	png, err := tb.capture()
	if err != nil {
		tb.b.t.Logf("screenshot %s: %v", name, err)
		return nil
	}
	prefix := fmt.Sprintf("%02d-", tb.shot)
	if tb.name != "" {
		prefix += sanitize(tb.name) + "-"
	}
	p := filepath.Join(tb.b.dir, prefix+name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		tb.b.t.Errorf("write %s: %v", p, err)
	}
	return png
}

// capture takes a PNG of the whole document at the current viewport width.
func (tb *tab) capture() ([]byte, error) {
	ctx, cancel := context.WithTimeout(tb.ctx, waitFor)
	defer cancel()
	return chromedp.Run(ctx, func(ctx context.Context, t *chromedp.Target) ([]byte, error) {
		m, err := cdp.Call(ctx, t, page.GetLayoutMetrics, cdp.Empty{})
		if err != nil {
			return nil, err
		}
		size := m.CSSContentSize
		vp := m.CSSLayoutViewport
		w, h := float64(vp.ClientWidth), math.Ceil(size.Height)
		if h < float64(vp.ClientHeight) {
			h = float64(vp.ClientHeight)
		}
		r, err := cdp.Call(ctx, t, page.CaptureScreenshot, page.CaptureScreenshotParams{
			Format:                page.CaptureScreenshotFormatPng,
			Clip:                  &page.Viewport{X: 0, Y: 0, Width: w, Height: h, Scale: 1},
			CaptureBeyondViewport: new(true),
			FromSurface:           new(true),
		})
		if err != nil {
			return nil, err
		}
		return r.Data, nil
	})
}

// viewport sets the tab's size: a phone (mobile emulation, touch) or a
// desktop window.
func (tb *tab) viewport(width, height int64, mobile bool) {
	tb.b.t.Helper()
	tb.do(fmt.Sprintf("viewport %dx%d", width, height), chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		scale := 1.0
		if mobile {
			scale = 2
		}
		if _, err := cdp.Call(ctx, t, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{
			Width: width, Height: height, DeviceScaleFactor: scale, Mobile: mobile,
		}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, t, emulation.SetTouchEmulationEnabled, emulation.SetTouchEmulationEnabledParams{Enabled: mobile})
		return err
	}))
}
