package browsertest

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// faultyProxy stands between the page and the stack like a load balancer
// whose gateway fails: it can drop every open WebSocket at once, and it
// answers the first purchase 502 after the stack took it (the 202 lost on
// the way back).
type faultyProxy struct {
	*httptest.Server
	purchases atomic.Int64

	mu       sync.Mutex
	hijacked map[net.Conn]bool
}

func newFaultyProxy(t *testing.T, target string) *faultyProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &faultyProxy{hijacked: make(map[net.Conn]bool)}
	p.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/purchase") && p.purchases.Add(1) == 1 {
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	p.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateHijacked { // a WebSocket, proxied byte for byte
			p.mu.Lock()
			p.hijacked[c] = true
			p.mu.Unlock()
		}
	}
	p.Start()
	t.Cleanup(p.Close)
	return p
}

// dropSockets closes every proxied WebSocket, as a dying gateway does.
func (p *faultyProxy) dropSockets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.hijacked)
	for c := range p.hijacked {
		_ = c.Close()
		delete(p.hijacked, c)
	}
	return n
}

// TestPageSurvivesGatewayFaults: the waiting-room socket drops under an
// admitted shopper; the page reconnects by itself and comes back ADMITTED
// with the same place (no second place in the queue). Its purchase's
// answer is then lost (502 after the stack reserved): the page finds the
// order again instead of buying twice, and pays it.
func TestPageSurvivesGatewayFaults(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSale("Faulty drop", time.Now().Add(-time.Second), 100, 3)
	p := newFaultyProxy(t, s.App.PublicURL)

	b := newBrowser(t)
	tb := b.tab("")
	tb.navigate(s.shopperURL(p.URL, saleID, 9201, ""))
	tb.waitState("ADMITTED")
	tb.waitJS("socket open", `window.__fs.wsOpened === 1`)
	if n := p.dropSockets(); n != 1 {
		t.Fatalf("dropped %d sockets, want the page's one", n)
	}
	tb.waitJS("reconnected and admitted again", `window.__fs.wsOpened >= 2 &&
	  document.getElementById('queue-state').dataset.state === 'ADMITTED' &&
	  document.getElementById('transport').dataset.transport === 'websocket'`)
	tb.screenshot("reconnected")
	fig := s.adminSale(saleID)
	if q := fig["queue"].(map[string]any); q["joined"] != float64(1) {
		t.Errorf("queue figures after the reconnect = %v, want the one place it had", q)
	}

	buyAndPay(tb, items[0])
	if n := p.purchases.Load(); n != 1 {
		t.Errorf("%d purchases sent, want 1: a lost answer is looked up, not bought again", n)
	}
	if o := orderOf(s, 9201, saleID); o["status"] != "PAID" || o["orderId"] != tb.text("#order-id") {
		t.Fatalf("order by API = %v, page shows %s", o, tb.text("#order-id"))
	}
}
