package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale/auth"
)

const testSecret = "loadtest-secret"

// fakeStack implements just enough of CONTRACT sections 3–5 for the tool:
// one sale, admission in join order at the sale's rate, stock and one
// order per user (unless broken), orders payable after a short delay.
type fakeStack struct {
	t      testing.TB
	srv    *httptest.Server   // the first gateway
	srvs   []*httptest.Server // every gateway, sharing the state below
	lns    []*killableListener
	v      *auth.Verifier
	broken bool // oversells by one unit
	faults fakeFaults

	mu       sync.Mutex
	saleID   int64
	opensAt  time.Time
	rate     int
	items    []*fakeItem
	buyers   map[int64]string // user → orderId
	orders   map[string]*fakeOrder
	admitAt  map[int64]time.Time
	soldOut  chan struct{}
	closedSO bool
	ips      map[string]int
	// publicViews counts GETs of the public sale view (the preconnects).
	publicViews int
	// soldOutStays: how long each shopper never admitted stayed connected
	// after its SOLD_OUT was sent.
	soldOutStays []time.Duration
	stockBacks   int // units given back so far (fakeFaults.stockBack)
	nextJoin     atomic.Int64
	nextOrd      atomic.Int64
	purchases    int // purchase requests that reached the stock
	roomJoins    int // WebSocket joins
}

// fakeFaults are the server faults a fake stack plays, counted over its
// purchases (the n-th purchase that reaches the stock, from 1).
type fakeFaults struct {
	rejectFirst int // the first n orders are REJECTED right after their 202 (unit back)
	loseAfter   int // the order after the first n is forgotten right after its 202 (unit back)
	fail500     int // the first n purchases answer 500 without reserving
	dropAnswers int // the first n purchases reserve, then the connection closes unanswered
	admitOnly   int // only the first n joiners are ever admitted (0: all)
	roomBusy    int // the first n room joins are answered error UNAVAILABLE, closed 1013
	// firstWave: each shopper's admission comes this long before its turn,
	// with notBeforeMs at the turn (purchases before it are NOT_ADMITTED)
	firstWave time.Duration
	// stockBack: this many units come back after the sell-out (as after
	// rejected orders), each to one shopper who saw SOLD_OUT without
	// buying: it is admitted a little over a second later
	stockBack int
}

// killableListener is a gateway's listener that can die as a process
// does: the port refuses new connections and every open connection,
// hijacked WebSockets included, is closed at once.
type killableListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func (l *killableListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		c.Close()
		return nil, net.ErrClosed
	}
	l.conns = append(l.conns, c)
	return c, nil
}

func (l *killableListener) kill() {
	l.mu.Lock()
	l.dead = true
	conns := l.conns
	l.mu.Unlock()
	l.Listener.Close()
	for _, c := range conns {
		c.Close()
	}
}

// kill kills gateway i.
func (f *fakeStack) kill(i int) { f.lns[i].kill() }

func (f *fakeStack) urls() []string {
	var out []string
	for _, s := range f.srvs {
		out = append(out, s.URL)
	}
	return out
}

type fakeItem struct {
	ID, Quantity, Remaining int64
}

type fakeOrder struct {
	ID      string
	User    int64
	Item    int64
	Status  string
	Created time.Time
	Paid    time.Time
}

func newFakeStack(t testing.TB, broken bool) *fakeStack {
	return newFakeStackWith(t, broken, fakeFaults{}, 1)
}

// runFake runs the load test against a fake stack of one gateway that
// plays faults, and fails the test unless the run passes.
func runFake(t testing.TB, faults fakeFaults) *Report {
	t.Helper()
	f := newFakeStackWith(t, false, faults, 1)
	r, err := Run(context.Background(), fakeConfig(f))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return r
}

// runFakeBroken runs the load test with cfg and fails the test unless
// the run fails with a report that breaks exactly the invariants want.
// It returns the report and the run's error.
func runFakeBroken(t testing.TB, cfg Config, want ...string) (*Report, error) {
	t.Helper()
	r, err := Run(context.Background(), cfg)
	if err == nil || r == nil {
		t.Fatalf("Run = %v: want an invariant error with a report", err)
	}
	if got := brokenInvariants(r); !slices.Equal(got, want) {
		t.Errorf("broken = %q, want %q (%+v)", got, want, r.Invariants)
	}
	return r, err
}

// newFakeStackWith starts a fake stack of gateways gateways that plays
// faults.
func newFakeStackWith(t testing.TB, broken bool, faults fakeFaults, gateways int) *fakeStack {
	f := &fakeStack{t: t, v: auth.NewVerifier(testSecret), broken: broken, faults: faults,
		buyers: map[int64]string{}, orders: map[string]*fakeOrder{}, admitAt: map[int64]time.Time{},
		soldOut: make(chan struct{}), ips: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/admin/sales", f.createSale)
	mux.HandleFunc("GET /api/admin/sales/{id}", f.getSale)
	mux.HandleFunc("GET /api/flash-sales/sales/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.publicViews++
		f.mu.Unlock()
		writeJSONResp(w, 200, map[string]any{"id": r.PathValue("id")})
	})
	mux.HandleFunc("/api/flash-sales/sales/{id}/queue", f.queue)
	mux.HandleFunc("POST /api/flash-sales/items/{id}/purchase", f.purchase)
	mux.HandleFunc("GET /api/flash-sales/orders/{id}", f.getOrder)
	mux.HandleFunc("GET /api/flash-sales/sales/{id}/order", f.saleOrder)
	mux.HandleFunc("POST /api/flash-sales/orders/{id}/pay", f.pay)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		f.mu.Lock()
		f.ips[host]++
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	})
	for range max(gateways, 1) {
		srv := httptest.NewUnstartedServer(h)
		ln := &killableListener{Listener: srv.Listener}
		srv.Listener = ln
		srv.Start()
		t.Cleanup(srv.Close)
		f.srvs, f.lns = append(f.srvs, srv), append(f.lns, ln)
	}
	f.srv = f.srvs[0]
	return f
}

func writeErr(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":%q,"message":"fake"}`, code)
}

func writeJSONResp(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (f *fakeStack) principal(r *http.Request) (int64, bool, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return 0, false, false
	}
	p, err := f.v.Verify(tok)
	if err != nil {
		return 0, false, false
	}
	return p.UserID, p.Operator, true
}

func (f *fakeStack) createSale(w http.ResponseWriter, r *http.Request) {
	if _, op, ok := f.principal(r); !ok || !op {
		writeErr(w, 403, "FORBIDDEN")
		return
	}
	var b struct {
		StartsAt string `json:"startsAt"`
		Rate     int    `json:"admissionRatePerSecond"`
		Items    []struct {
			Quantity int64 `json:"quantity"`
		} `json:"items"`
	}
	if json.NewDecoder(r.Body).Decode(&b) != nil || len(b.Items) == 0 || b.Rate < 1 {
		writeErr(w, 400, "INVALID")
		return
	}
	at, err := time.Parse(time.RFC3339Nano, b.StartsAt)
	if err != nil {
		writeErr(w, 400, "INVALID")
		return
	}
	f.mu.Lock()
	f.saleID, f.opensAt, f.rate = 7, at, b.Rate
	for i, it := range b.Items {
		f.items = append(f.items, &fakeItem{ID: 1001 + int64(i), Quantity: it.Quantity, Remaining: it.Quantity})
	}
	f.mu.Unlock()
	f.getSaleLocked(w, 201)
}

func (f *fakeStack) getSale(w http.ResponseWriter, r *http.Request) {
	if _, op, ok := f.principal(r); !ok || !op {
		writeErr(w, 403, "FORBIDDEN")
		return
	}
	f.getSaleLocked(w, 200)
}

func (f *fakeStack) getSaleLocked(w http.ResponseWriter, status int) {
	f.mu.Lock()
	type item struct {
		ID        int64 `json:"id"`
		Quantity  int64 `json:"quantity"`
		Remaining int64 `json:"remaining"`
		Sold      int64 `json:"sold"`
		Paid      int64 `json:"paid"`
	}
	type queue struct {
		Waiting int64 `json:"waiting"`
	}
	out := struct {
		ID       int64     `json:"id"`
		StartsAt time.Time `json:"startsAt"`
		State    string    `json:"state"`
		Items    []item    `json:"items"`
		Queue    queue     `json:"queue"`
	}{ID: f.saleID, StartsAt: f.opensAt, State: "OPEN"}
	if f.closedSO {
		out.State = "SOLD_OUT"
	}
	for u, at := range f.admitAt {
		if _, bought := f.buyers[u]; !bought && time.Now().Before(at) {
			out.Queue.Waiting++
		}
	}
	for _, it := range f.items {
		x := item{ID: it.ID, Quantity: it.Quantity, Remaining: it.Remaining}
		for _, o := range f.orders {
			if o.Item == it.ID && o.Status != "REJECTED" {
				x.Sold++
				if o.Status == "PAID" {
					x.Paid++
				}
			}
		}
		out.Items = append(out.Items, x)
	}
	f.mu.Unlock()
	writeJSONResp(w, status, out)
}

// status computes a user's room status; it registers the join on first use.
func (f *fakeStack) status(user int64) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.admitAt[user]
	if !ok {
		n := f.nextJoin.Add(1)
		at = f.opensAt.Add(time.Duration(n) * time.Second / time.Duration(f.rate))
		if f.faults.admitOnly > 0 && n > int64(f.faults.admitOnly) {
			at = f.opensAt.Add(time.Hour)
		}
		f.admitAt[user] = at
	}
	now := time.Now()
	m := map[string]any{"type": "status", "serverTimeMs": now.UnixMilli(), "opensAtMs": f.opensAt.UnixMilli(), "position": 0}
	switch {
	case f.closedSO:
		m["state"] = "SOLD_OUT"
	case now.Before(f.opensAt):
		m["state"] = "PREQUEUE"
	case now.Before(at):
		m["state"] = "WAITING"
	default:
		m["state"] = "ADMITTED"
		m["admissionToken"] = fmt.Sprintf("adm-%d", user)
		m["items"] = f.itemsLocked()
	}
	return m
}

func (f *fakeStack) itemsLocked() []map[string]any {
	var out []map[string]any
	for _, it := range f.items {
		out = append(out, map[string]any{"id": it.ID, "purchaseUrl": fmt.Sprintf("/api/flash-sales/items/%d/purchase", it.ID)})
	}
	return out
}

func (f *fakeStack) queue(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") == "" {
		user, _, ok := f.principal(r)
		if !ok {
			writeErr(w, 401, "UNAUTHENTICATED")
			return
		}
		writeJSONResp(w, 200, f.status(user))
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	_, data, err := c.Read(ctx)
	if err != nil {
		return
	}
	var join struct {
		Type        string `json:"type"`
		AccessToken string `json:"accessToken"`
	}
	json.Unmarshal(data, &join)
	p, err := f.v.Verify(join.AccessToken)
	if join.Type != "join" || err != nil {
		wsSend(ctx, c, map[string]any{"type": "error", "error": "UNAUTHENTICATED"})
		c.Close(websocket.StatusPolicyViolation, "")
		return
	}
	f.mu.Lock()
	f.roomJoins++
	busy := f.roomJoins <= f.faults.roomBusy
	f.mu.Unlock()
	if busy {
		wsSend(ctx, c, map[string]any{"type": "error", "error": "UNAVAILABLE", "message": "fake"})
		c.Close(websocket.StatusTryAgainLater, "UNAVAILABLE")
		return
	}
	ctx = c.CloseRead(ctx)
	st := f.status(p.UserID)
	wsSend(ctx, c, stripAdmission(st))
	f.mu.Lock()
	at, so := f.admitAt[p.UserID], f.soldOut
	f.mu.Unlock()
	select {
	case <-ctx.Done():
		return
	case <-so:
	case <-time.After(time.Until(at.Add(-f.faults.firstWave))):
	}
	st = f.status(p.UserID)
	admitted := st["state"] == "ADMITTED"
	f.mu.Lock()
	early := !admitted && f.faults.firstWave > 0 && !f.closedSO && time.Now().Before(at)
	items := f.itemsLocked()
	f.mu.Unlock()
	if admitted || early {
		adm := map[string]any{"type": "admitted", "admissionToken": fmt.Sprintf("adm-%d", p.UserID),
			"expiresAtMs": time.Now().Add(time.Minute).UnixMilli(), "items": items}
		if early {
			adm["notBeforeMs"] = at.Add(time.Millisecond - 1).UnixMilli() // rounded up, as the room does
		} else {
			wsSend(ctx, c, stripAdmission(st))
		}
		wsSend(ctx, c, adm)
		admitted = true
		select {
		case <-ctx.Done():
			return
		case <-so:
		}
	}
	wsSend(ctx, c, map[string]any{"type": "status", "state": "SOLD_OUT"})
	sent := time.Now()
	if !admitted && f.faults.stockBack > 0 {
		if adm := f.giveBack(ctx, p.UserID); adm != nil {
			wsSend(ctx, c, adm)
			admitted = true
		}
	}
	<-ctx.Done()
	if !admitted {
		f.mu.Lock()
		f.soldOutStays = append(f.soldOutStays, time.Since(sent))
		f.mu.Unlock()
	}
}

// giveBack plays fakeFaults.stockBack for a shopper who just saw SOLD_OUT:
// while units are left to give back, one more unit of the first item and,
// 1.1 s later (past the tool's sold-out memory), an admission for user.
func (f *fakeStack) giveBack(ctx context.Context, user int64) map[string]any {
	f.mu.Lock()
	if f.stockBacks >= f.faults.stockBack {
		f.mu.Unlock()
		return nil
	}
	f.stockBacks++
	it := f.items[0]
	it.Quantity++
	it.Remaining++
	f.mu.Unlock()
	if !sleepCtx(ctx, 1100*time.Millisecond) {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.admitAt[user] = time.Now()
	return map[string]any{"type": "admitted", "admissionToken": fmt.Sprintf("adm-%d", user),
		"expiresAtMs": time.Now().Add(time.Minute).UnixMilli(), "items": f.itemsLocked()}
}

func stripAdmission(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		if k != "admissionToken" && k != "items" {
			out[k] = v
		}
	}
	return out
}

func wsSend(ctx context.Context, c *websocket.Conn, v any) {
	b, _ := json.Marshal(v)
	c.Write(ctx, websocket.MessageText, b)
}

func (f *fakeStack) purchase(w http.ResponseWriter, r *http.Request) {
	user, _, ok := f.principal(r)
	if !ok {
		writeErr(w, 401, "UNAUTHENTICATED")
		return
	}
	item, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	f.mu.Lock()
	defer f.mu.Unlock()
	at, joined := f.admitAt[user]
	if r.Header.Get("X-Admission-Token") != fmt.Sprintf("adm-%d", user) || !joined || time.Now().Before(at) || time.Now().Before(f.opensAt) {
		writeErr(w, 403, "NOT_ADMITTED")
		return
	}
	var it *fakeItem
	for _, x := range f.items {
		if x.ID == item {
			it = x
		}
	}
	if it == nil {
		writeErr(w, 404, "NOT_FOUND")
		return
	}
	if id, ok := f.buyers[user]; ok {
		writeJSONResp(w, 409, map[string]string{"error": "ALREADY_PURCHASED", "orderId": id})
		return
	}
	floor := int64(0)
	if f.broken {
		floor = -1 // sells one unit too many
	}
	if it.Remaining <= floor {
		writeErr(w, 410, "SOLD_OUT")
		return
	}
	f.purchases++
	if f.purchases <= f.faults.fail500 {
		writeErr(w, 500, "INTERNAL")
		return
	}
	it.Remaining--
	n := f.nextOrd.Add(1)
	id := fmt.Sprintf("00000000-0000-0000-0000-%012d", n)
	f.buyers[user] = id
	f.orders[id] = &fakeOrder{ID: id, User: user, Item: item, Status: "PENDING", Created: time.Now()}
	switch {
	case n <= int64(f.faults.rejectFirst):
		// The database refused it: the unit goes back.
		f.orders[id].Status = "REJECTED"
		delete(f.buyers, user)
		it.Remaining++
	case f.faults.loseAfter > 0 && n == int64(f.faults.loseAfter)+1:
		// Forgotten, as a broker that lost it would.
		delete(f.orders, id)
		delete(f.buyers, user)
		it.Remaining++
	}
	all := true
	for _, x := range f.items {
		if x.Remaining > floor {
			all = false
		}
	}
	if all && !f.closedSO {
		f.closedSO = true
		close(f.soldOut)
	}
	if f.purchases <= f.faults.fail500+f.faults.dropAnswers {
		// Reserved, but the answer is lost with the connection, cut
		// after its first bytes (a connection closed before any byte
		// is one the client re-sends on its own).
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Write([]byte("HTTP/1.1 202 Accepted\r\nContent-"))
				c.Close()
				return
			}
		}
	}
	writeJSONResp(w, 202, map[string]string{"orderId": id, "status": "PENDING"})
}

// saleOrder is GET /api/flash-sales/sales/{id}/order: the caller's order.
func (f *fakeStack) saleOrder(w http.ResponseWriter, r *http.Request) {
	user, _, ok := f.principal(r)
	if !ok {
		writeErr(w, 401, "UNAUTHENTICATED")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.orders[f.buyers[user]]
	if o == nil {
		writeErr(w, 404, "NOT_FOUND")
		return
	}
	writeJSONResp(w, 200, map[string]any{"orderId": o.ID, "itemId": o.Item, "status": o.Status})
}

func (f *fakeStack) order(r *http.Request) (*fakeOrder, bool) {
	user, _, ok := f.principal(r)
	if !ok {
		return nil, false
	}
	o := f.orders[r.PathValue("id")]
	return o, o != nil && o.User == user
}

func (f *fakeStack) getOrder(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.order(r)
	if !ok {
		writeErr(w, 404, "NOT_FOUND")
		return
	}
	writeJSONResp(w, 200, map[string]any{"orderId": o.ID, "itemId": o.Item, "status": o.Status, "payable": time.Since(o.Created) > 20*time.Millisecond})
}

func (f *fakeStack) pay(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.order(r)
	if !ok {
		writeErr(w, 404, "NOT_FOUND")
		return
	}
	if time.Since(o.Created) <= 20*time.Millisecond {
		writeErr(w, 409, "NOT_PAYABLE_YET")
		return
	}
	o.Status, o.Paid = "PAID", time.Now()
	writeJSONResp(w, 200, map[string]string{"orderId": o.ID, "status": "PAID"})
}

func (f *fakeStack) sourceIPs() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.ips {
		out[k] = v
	}
	return out
}
