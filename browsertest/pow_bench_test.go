package browsertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flashsale/flashsale/static"
)

// BenchmarkPowSolveChromium measures how long the shopper page's
// proof-of-work solver (static/site/assets/pow.js, the code the page's Web
// Worker runs) takes in headless Chromium per difficulty setting, so
// operators can pick a difficulty as an expected solve time. It reports
// ms per solve and hashes per second; it asserts no speed.
func BenchmarkPowSolveChromium(b *testing.B) {
	exe := os.Getenv("FLASHSALE_CHROMIUM")
	if exe == "" {
		exe = defaultChromium
	}
	if _, err := os.Stat(exe); err != nil {
		b.Skipf("chromium not found at %s", exe)
	}
	site, err := static.New()
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := site.Lookup(r.URL.Path)
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", f.ContentType)
		w.Write(f.Body)
	}))
	defer srv.Close()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe), chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(b.TempDir()))
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		b.Fatalf("chromium: %v", err)
	}
	for _, d := range []int64{10_000, 100_000, 500_000, 2_000_000} {
		b.Run(fmt.Sprintf("difficulty=%d", d), func(b *testing.B) {
			var hashes int64
			var total time.Duration
			for i := 0; i < b.N; i++ {
				salt := make([]byte, 16)
				rand.Read(salt)
				thr := new(big.Int).Div(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(d))
				js := fmt.Sprintf(`import('/assets/pow.js').then(m => {
					const t0 = performance.now();
					const n = m.solve({algorithm: 'SHA-256', salt: %q, difficulty: %d, threshold: %q});
					return {n, ms: performance.now() - t0};
				})`, hex.EncodeToString(salt), d, fmt.Sprintf("%064x", thr))
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Minute)
				res, err := chromedp.Run(rctx, chromedp.Evaluate[struct {
					N  int64   `json:"n"`
					Ms float64 `json:"ms"`
				}](js, chromedp.EvalAwaitPromise))
				rcancel()
				if err != nil {
					b.Fatal(err)
				}
				hashes += res.N + 1
				total += time.Duration(res.Ms * float64(time.Millisecond))
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/solve")
			b.ReportMetric(float64(hashes)/total.Seconds(), "hashes/s")
		})
	}
}
