package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/admission"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/defense"
)

const testSecret = "test-secret-0123456789abcdef"

var testNow = time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)

// countingAccess is the real verifier, counted.
type countingAccess struct {
	v     *auth.Verifier
	calls atomic.Int64
}

func (a *countingAccess) VerifyAt(token string, _ time.Time) (flashsale.Principal, error) {
	a.calls.Add(1)
	return a.v.Verify(token)
}

type fakeSales struct {
	mu        sync.Mutex
	sales     map[int64]*flashsale.Sale
	remaining map[int64]map[int64]int64
	remErr    error
	remCalls  atomic.Int64
}

func (f *fakeSales) Sale(id int64) (*flashsale.Sale, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sales[id]
	return s, ok
}

func (f *fakeSales) ItemSale(itemID int64) (*flashsale.Sale, flashsale.Item, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.sales {
		if it, ok := s.Item(itemID); ok {
			return s, it, true
		}
	}
	return nil, flashsale.Item{}, false
}

func (f *fakeSales) Remaining(_ context.Context, saleID int64) (map[int64]int64, error) {
	f.remCalls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.remErr != nil {
		return nil, f.remErr
	}
	return f.remaining[saleID], nil
}

type fakePurchase struct {
	mu      sync.Mutex
	soldOut map[int64]bool
	reserve func(sale *flashsale.Sale, item flashsale.Item, userID int64) (string, error)
	calls   atomic.Int64
	claims  atomic.Int64 // Claim calls (queue order)
}

func (f *fakePurchase) SoldOut(itemID int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.soldOut[itemID]
}

func (f *fakePurchase) Reserve(_ context.Context, sale *flashsale.Sale, item flashsale.Item, userID int64) (string, error) {
	f.calls.Add(1)
	if f.reserve != nil {
		return f.reserve(sale, item, userID)
	}
	return "3f1c9a52-8c5e-4c57-9f0e-1d2b3c4d5e6f", nil
}

func (f *fakePurchase) Claim(_ context.Context, sale *flashsale.Sale, item flashsale.Item, userID int64) (string, error) {
	f.claims.Add(1)
	return "0c1a1a52-8c5e-4c57-9f0e-1d2b3c4d5e6f", nil
}

type fakeOrders struct {
	mu      sync.Mutex
	orders  map[string]flashsale.Order
	block   chan struct{} // when set, Get waits on it
	entered chan struct{}
}

func (f *fakeOrders) find(userID int64, id string) (flashsale.Order, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.orders[id]
	if !ok || o.UserID != userID {
		return flashsale.Order{}, flashsale.Errorf(flashsale.CodeNotFound, "no such order")
	}
	return o, nil
}

func (f *fakeOrders) Get(_ context.Context, userID int64, id string) (flashsale.Order, error) {
	if id == panicOrderID {
		panic("boom")
	}
	if f.block != nil {
		f.entered <- struct{}{}
		<-f.block
	}
	return f.find(userID, id)
}

func (f *fakeOrders) BySale(_ context.Context, userID, saleID int64) (flashsale.Order, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range f.orders {
		if o.UserID == userID && o.SaleID == saleID {
			return o, nil
		}
	}
	return flashsale.Order{}, flashsale.Errorf(flashsale.CodeNotFound, "no order in this sale")
}

func (f *fakeOrders) Pay(ctx context.Context, userID int64, id string) (flashsale.Order, error) {
	o, err := f.find(userID, id)
	if err != nil {
		return o, err
	}
	switch o.Status {
	case flashsale.OrderExpired:
		return o, flashsale.Errorf(flashsale.CodeOrderExpired, "order expired")
	case flashsale.OrderCancelled:
		return o, flashsale.Errorf(flashsale.CodeOrderCancelled, "order cancelled")
	}
	if !o.Payable {
		return o, flashsale.Errorf(flashsale.CodeNotPayableYet, "retry shortly")
	}
	o.Status = flashsale.OrderPaid
	return o, nil
}

func (f *fakeOrders) Cancel(_ context.Context, userID int64, id string) (flashsale.Order, error) {
	o, err := f.find(userID, id)
	if err != nil {
		return o, err
	}
	if o.Status == flashsale.OrderPaid {
		return o, flashsale.Errorf(flashsale.CodeOrderPaid, "paid orders cannot be cancelled")
	}
	o.Status = flashsale.OrderCancelled
	return o, nil
}

const panicOrderID = "00000000-0000-0000-0000-00000000dead"

type fakeQueue struct {
	mu       sync.Mutex
	refused  map[string]int // "saleID/rule" → joins refused at the edge
	handler  http.Handler
	joinPoW  atomic.Value // json.RawMessage
	joinIP   atomic.Value // netip.Addr
	figErr   error
	joinErr  error
	lastAddr atomic.Value // string: r.RemoteAddr seen by ServeHTTP
}

func (q *fakeQueue) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q.lastAddr.Store(r.RemoteAddr)
	if q.handler != nil {
		q.handler.ServeHTTP(w, r)
		return
	}
	w.WriteHeader(http.StatusTeapot)
}

func (q *fakeQueue) Join(_ context.Context, p flashsale.Principal, saleID int64, ip netip.Addr, pow json.RawMessage, _ string) (any, error) {
	if q.joinErr != nil {
		return nil, q.joinErr
	}
	q.joinPoW.Store(append(json.RawMessage(nil), pow...))
	q.joinIP.Store(ip)
	return map[string]any{"type": "status", "state": "WAITING", "position": 3, "userId": p.UserID, "saleId": saleID}, nil
}

func (q *fakeQueue) Choose(context.Context, flashsale.Principal, int64, int64) error { return nil }

func (q *fakeQueue) Refused(saleID int64, rule string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.refused == nil {
		q.refused = map[string]int{}
	}
	q.refused[fmt.Sprintf("%d/%s", saleID, rule)]++
}

func (q *fakeQueue) refusals() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return fmt.Sprint(q.refused)
}

func (q *fakeQueue) Status(_ context.Context, p flashsale.Principal, saleID int64) (any, error) {
	return map[string]any{"type": "status", "state": "ADMITTED", "position": 0, "userId": p.UserID, "saleId": saleID}, nil
}

func (q *fakeQueue) Figures(context.Context, int64) (flashsale.QueueFigures, error) {
	return flashsale.QueueFigures{Joined: 10, Admitted: 4, Waiting: 6}, q.figErr
}

// fakeGuard resolves the client address from X-Forwarded-For when it
// parses, blocks and rate-limits listed addresses and users.
type fakeGuard struct {
	blockedAddr map[netip.Addr]bool
	limitedAddr map[netip.Addr]bool
	blockedUser map[int64]bool
	limitedUser map[int64]bool
	addrChecks  atomic.Int64
	classes     sync.Map     // class → true
	lastClass   atomic.Value // string
	lastXFF     atomic.Value // string
}

func (g *fakeGuard) ClientAddr(peer netip.Addr, xff string) netip.Addr {
	g.lastXFF.Store(xff)
	if a, err := netip.ParseAddr(strings.TrimSpace(xff)); err == nil {
		return a
	}
	return peer
}

func (g *fakeGuard) CheckAddrAt(ip netip.Addr, class string, _ time.Time) (time.Duration, error) {
	g.addrChecks.Add(1)
	g.classes.Store(class, true)
	g.lastClass.Store(class)
	if g.blockedAddr[ip] {
		return 0, flashsale.Errorf(flashsale.CodeBlocked, "blocked")
	}
	if g.limitedAddr[ip] {
		return 2500 * time.Millisecond, flashsale.Errorf(flashsale.CodeRateLimited, "slow down")
	}
	return 0, nil
}

func (g *fakeGuard) CheckUserAt(userID int64, class string, _ time.Time) (time.Duration, error) {
	if g.blockedUser[userID] {
		return 0, flashsale.Errorf(flashsale.CodeBlocked, "blocked")
	}
	if g.limitedUser[userID] {
		return time.Second, flashsale.Errorf(flashsale.CodeRateLimited, "slow down")
	}
	return 0, nil
}

func (g *fakeGuard) Counters() []defense.Counter {
	return []defense.Counter{{Rule: "blocklist", Outcome: "blocked", Count: 1}}
}

type fakeSettings struct {
	mu     sync.Mutex
	doc    json.RawMessage
	actors []string
}

func (f *fakeSettings) Get(context.Context) (json.RawMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.doc, nil
}

func (f *fakeSettings) PutIf(_ context.Context, actor string, _ int64, body json.RawMessage) (json.RawMessage, error) {
	var probe struct {
		Pow *struct {
			Difficulty int `json:"difficulty"`
		} `json:"pow"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		return nil, flashsale.Errorf(flashsale.CodeInvalid, "pow.difficulty: wrong type")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.doc = body
	f.actors = append(f.actors, actor)
	return body, nil
}

func (f *fakeSettings) ApplyPreset(_ context.Context, actor, name string) (json.RawMessage, error) {
	if name != "strict" {
		return nil, flashsale.Errorf(flashsale.CodeNotFound, "no such preset")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actors = append(f.actors, actor)
	return json.RawMessage(`{"preset":"strict"}`), nil
}

func (f *fakeSettings) Audit(_ context.Context, limit int) (json.RawMessage, error) {
	return json.RawMessage(`[{"limit":` + itoa(int64(limit)) + `}]`), nil
}

// fakeReports answers the same report for every sale: two minutes of the
// room, two of orders, one of them shared.
type fakeReports struct{}

func (fakeReports) RoomReport(context.Context, int64) (flashsale.RoomReport, error) {
	t0 := time.Date(2026, 12, 1, 18, 30, 0, 0, time.UTC)
	return flashsale.RoomReport{Joined: 12, PreQueue: 10, Admitted: 9, Waiting: 3, Refusals: map[string]int64{"blocklist": 2},
		Shadowed: map[string]int64{"risk": 3},
		Wait:     flashsale.WaitFigures{Count: 9, MinMs: 100, P50Ms: 500, P90Ms: 1000, P99Ms: 1500, MaxMs: 1500},
		Minutes: []flashsale.RoomMinute{
			{At: t0, Joins: 10, Joined: 10, PreQueue: 10, Admissions: 5, Admitted: 5, Waiting: 5, Refusals: map[string]int64{"blocklist": 2},
				Shadowed: map[string]int64{"risk": 3},
				Wait:     flashsale.WaitFigures{Count: 5, MinMs: 100, P50Ms: 250, P90Ms: 500, P99Ms: 500, MaxMs: 500}},
			{At: t0.Add(time.Minute), Joins: 2, Joined: 12, PreQueue: 10, Admissions: 4, Admitted: 9, Waiting: 3,
				Refusals: map[string]int64{}, Shadowed: map[string]int64{},
				Wait: flashsale.WaitFigures{Count: 4, MinMs: 500, P50Ms: 1000, P90Ms: 1500, P99Ms: 1500, MaxMs: 1500}},
		}}, nil
}

func (fakeReports) OrderReport(_ context.Context, saleID int64) (flashsale.OrderReport, error) {
	t1 := time.Date(2026, 12, 1, 18, 31, 0, 0, time.UTC)
	item := saleID*1000 + 1
	return flashsale.OrderReport{ByStatus: map[flashsale.OrderStatus]int64{flashsale.OrderPending: 3, flashsale.OrderPaid: 1},
		Items: []flashsale.ItemSold{{ItemID: item, Sold: 4, Paid: 1}}, Sold: 4, Placed: 4, Paid: 1, Conversion: 0.25,
		Minutes: []flashsale.OrderMinute{
			{At: t1, Items: []flashsale.ItemMinute{{ItemID: item, Sold: 4}}, Sold: 4},
			{At: t1.Add(time.Minute), Items: []flashsale.ItemMinute{}, Paid: 1},
		}}, nil
}

type fakeSaleAdmin struct {
	mu     sync.Mutex
	sales  map[int64]flashsale.Sale
	nextID int64
	err    error // returned by List when set
}

func (f *fakeSaleAdmin) Create(_ context.Context, s flashsale.Sale) (flashsale.Sale, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	s.ID = f.nextID
	s.ShuffleCommitment = strings.Repeat("ab", 32)
	for i := range s.Items {
		s.Items[i].ID = s.ID*1000 + int64(i) + 1
		s.Items[i].SaleID = s.ID
	}
	f.sales[s.ID] = s
	return s, nil
}

func (f *fakeSaleAdmin) Get(_ context.Context, id int64) (flashsale.Sale, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sales[id]
	if !ok {
		return s, flashsale.Errorf(flashsale.CodeNotFound, "no such sale")
	}
	return s, nil
}

func (f *fakeSaleAdmin) List(context.Context) ([]flashsale.Sale, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	out := make([]flashsale.Sale, 0, len(f.sales))
	for id := int64(1); id <= f.nextID; id++ {
		if s, ok := f.sales[id]; ok {
			out = append(out, s)
		}
	}
	return out, nil
}

func (f *fakeSaleAdmin) Update(_ context.Context, id int64, u flashsale.SaleUpdate) (flashsale.Sale, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sales[id]
	if !ok {
		return s, flashsale.Errorf(flashsale.CodeNotFound, "no such sale")
	}
	if u.Name != nil {
		s.Name = *u.Name
	}
	if u.AdmissionRatePerSecond != nil {
		s.AdmissionRatePerSecond = *u.AdmissionRatePerSecond
	}
	if u.EndsAt != nil {
		s.EndsAt = *u.EndsAt
	}
	f.sales[id] = s
	return s, nil
}

func (f *fakeSaleAdmin) Act(_ context.Context, id int64, a flashsale.SaleAction) (flashsale.Sale, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sales[id]
	if !ok {
		return s, flashsale.Errorf(flashsale.CodeNotFound, "no such sale")
	}
	if a.Kind == flashsale.ActionPause || a.Kind == flashsale.ActionResume {
		s.Paused = a.Kind == flashsale.ActionPause
	}
	f.sales[id] = s
	return s, nil
}

func (f *fakeSaleAdmin) Figures(_ context.Context, saleID int64) ([]flashsale.ItemFigures, error) {
	s, err := f.Get(context.Background(), saleID)
	if err != nil {
		return nil, err
	}
	var out []flashsale.ItemFigures
	for _, it := range s.Items {
		out = append(out, flashsale.ItemFigures{ItemID: it.ID, Remaining: it.Quantity - 3, Sold: 3, Paid: 1, Expired: 2, Cancelled: 1, Rejected: 0})
	}
	return out, nil
}

type fakeStatic map[string]StaticFile

var shopPage = StaticFile{Body: []byte("<html>shop</html>"), Gzip: []byte("GZ"), ContentType: "text/html; charset=utf-8",
	ETag: `"idx1"`, GzipETag: `"idx1-gz"`, CacheControl: "public, max-age=60"}

func (f fakeStatic) Lookup(name string) (StaticFile, bool) { s, ok := f[name]; return s, ok }

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// env is a gateway wired with fakes, at a fixed clock.
type env struct {
	t        testing.TB
	srv      *Server
	access   *countingAccess
	adm      *admission.Signer
	sales    *fakeSales
	admin    *fakeSaleAdmin
	purchase *fakePurchase
	orders   *fakeOrders
	queue    *fakeQueue
	guard    *fakeGuard
	settings *fakeSettings
}

// Fixtures: sale 1 open (items 101, 102 with 102 sold out), sale 2
// scheduled (item 201), sale 3 ended (item 301).
func newEnv(t testing.TB, tweak ...func(*Config, *Deps)) *env {
	t.Helper()
	seed := make([]byte, 32)
	for i := range seed {
		seed[i] = byte(i)
	}
	open := &flashsale.Sale{ID: 1, Name: "Winter drop", StartsAt: testNow.Add(-time.Minute), AdmissionRatePerSecond: 100,
		ShuffleSeed: seed, ShuffleCommitment: "c0ffee",
		Items: []flashsale.Item{{ID: 101, SaleID: 1, ProductID: 501, Quantity: 10, PriceCents: 1999}, {ID: 102, SaleID: 1, ProductID: 502, Quantity: 5, PriceCents: 999}}}
	sched := &flashsale.Sale{ID: 2, Name: "Later", StartsAt: testNow.Add(time.Hour), AdmissionRatePerSecond: 10, ShuffleSeed: seed, ShuffleCommitment: "c0ffee",
		Items: []flashsale.Item{{ID: 201, SaleID: 2, ProductID: 601, Quantity: 1, PriceCents: 100}}}
	ended := &flashsale.Sale{ID: 3, Name: "Gone", StartsAt: testNow.Add(-2 * time.Hour), EndsAt: testNow.Add(-time.Hour), AdmissionRatePerSecond: 10,
		Items: []flashsale.Item{{ID: 301, SaleID: 3, ProductID: 701, Quantity: 1, PriceCents: 100}}}
	signer, err := admission.NewSigner(admission.Key{ID: 1, Secret: []byte("admission-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{
		t:      t,
		access: &countingAccess{v: auth.NewVerifier(testSecret, auth.WithClock(func() time.Time { return testNow }))},
		adm:    signer,
		sales: &fakeSales{sales: map[int64]*flashsale.Sale{1: open, 2: sched, 3: ended},
			remaining: map[int64]map[int64]int64{1: {101: 7, 102: 0}, 2: {201: 1}}},
		admin:    &fakeSaleAdmin{sales: map[int64]flashsale.Sale{}},
		purchase: &fakePurchase{soldOut: map[int64]bool{102: true}},
		orders: &fakeOrders{orders: map[string]flashsale.Order{
			orderA: {ID: orderA, SaleID: 1, ItemID: 101, UserID: 7, Status: flashsale.OrderPending, PriceCents: 1999,
				CreatedAt: testNow, ExpiresAt: testNow.Add(10 * time.Minute), Payable: true},
			orderPaid:    {ID: orderPaid, SaleID: 2, ItemID: 201, UserID: 7, Status: flashsale.OrderPaid, Payable: true, CreatedAt: testNow, ExpiresAt: testNow},
			orderExpired: {ID: orderExpired, SaleID: 3, ItemID: 301, UserID: 7, Status: flashsale.OrderExpired, Payable: true, CreatedAt: testNow, ExpiresAt: testNow},
			orderUnpay:   {ID: orderUnpay, SaleID: 3, ItemID: 301, UserID: 8, Status: flashsale.OrderPending, CreatedAt: testNow, ExpiresAt: testNow},
		}},
		queue: &fakeQueue{},
		guard: &fakeGuard{
			blockedAddr: map[netip.Addr]bool{netip.MustParseAddr("203.0.113.5"): true},
			limitedAddr: map[netip.Addr]bool{netip.MustParseAddr("198.51.100.9"): true},
			blockedUser: map[int64]bool{42: true},
			limitedUser: map[int64]bool{43: true},
		},
		settings: &fakeSettings{doc: json.RawMessage(`{"pow":{"difficulty":0}}`)},
	}
	cfg := Config{Now: func() time.Time { return testNow }}
	deps := Deps{
		Access: e.access, Admission: signer, Sales: e.sales, Stock: e.sales, SaleAdmin: e.admin, Purchase: e.purchase,
		Orders: e.orders, Queue: e.queue, Guard: e.guard, Settings: e.settings, Reports: fakeReports{},
		Static: fakeStatic{
			"/":              shopPage,
			"/sales/7":       shopPage,
			"/operator":      {Body: []byte("<html>op</html>"), ContentType: "text/html; charset=utf-8", ETag: `"op1"`, CacheControl: "public, max-age=60"},
			"/assets/app.js": {Body: []byte("js()"), ContentType: "text/javascript", ETag: `"js1"`, CacheControl: "public, max-age=31536000, immutable"},
		},
	}
	for _, f := range tweak {
		f(&cfg, &deps)
	}
	e.srv = New(cfg, deps)
	return e
}

const (
	orderA       = "3f1c9a52-8c5e-4c57-9f0e-1d2b3c4d5e6f"
	orderPaid    = "11111111-2222-4333-8444-555555555555"
	orderExpired = "22222222-2222-4333-8444-555555555555"
	orderUnpay   = "33333333-2222-4333-8444-555555555555"
)

func (e *env) token(userID int64, operator bool) string {
	e.t.Helper()
	tok, err := auth.Mint(testSecret, userID, operator, time.Hour, testNow)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

func (e *env) admit(userID, saleID int64) string {
	return e.adm.Sign(flashsale.Admission{UserID: userID, SaleID: saleID, ExpiresAt: testNow.Add(5 * time.Minute)})
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

// errCode is the "error" field of a JSON error body ("" when absent).
func (r resp) errCode() string {
	var b struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	_ = json.Unmarshal(r.body, &b)
	return b.Error
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
}

// do sends one request through app.Test. headers alternate name, value.
func (e *env) do(method, path, body string, headers ...string) resp {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := e.srv.App().Test(req, 5000)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func bearer(tok string) string { return "Bearer " + tok }

var errBoom = errors.New("database on fire")

func (q *fakeQueue) ShadowList(_ context.Context, saleID int64, limit int) (any, error) {
	return map[string]any{"shadowed": 0, "byRule": map[string]int64{}, "released": 0, "shoppers": []any{}}, nil
}

func (q *fakeQueue) ReleaseShadowed(_ context.Context, saleID, userID int64) error {
	return flashsale.Errorf(flashsale.CodeNotFound, "user %d is not in this sale's shadow queue", userID)
}
