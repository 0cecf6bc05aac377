package waitroom

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/admission"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const jwtSecret = "waitroom-test-secret"

// clock is a settable test clock.
type clock struct{ ms atomic.Int64 }

func newClock(t time.Time) *clock        { c := &clock{}; c.ms.Store(t.UnixMilli()); return c }
func (c *clock) Now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *clock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// fakeSales is an in-memory SaleSource.
type fakeSales struct {
	mu sync.Mutex
	m  map[int64]*flashsale.Sale
	// reads left before a sale leaves the source (vanishAfter)
	left map[int64]int
}

func (f *fakeSales) Sale(id int64) (*flashsale.Sale, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n, ok := f.left[id]; ok {
		if n <= 0 {
			return nil, false
		}
		f.left[id] = n - 1
	}
	s, ok := f.m[id]
	return s, ok
}

// vanishAfter makes the sale leave the source after n more reads, as a
// cache reload without it would.
func (f *fakeSales) vanishAfter(id int64, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.left == nil {
		f.left = map[int64]int{}
	}
	f.left[id] = n
}

func (f *fakeSales) put(s *flashsale.Sale) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[int64]*flashsale.Sale{}
	}
	f.m[s.ID] = s
}

// fakeStock is an in-memory StockSource (stock is not what these tests test).
type fakeStock struct {
	mu sync.Mutex
	m  map[int64]map[int64]int64
}

func (f *fakeStock) Remaining(_ context.Context, saleID int64) (map[int64]int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int64]int64{}
	for k, v := range f.m[saleID] {
		out[k] = v
	}
	return out, nil
}

func (f *fakeStock) set(saleID, itemID, n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[int64]map[int64]int64{}
	}
	if f.m[saleID] == nil {
		f.m[saleID] = map[int64]int64{}
	}
	f.m[saleID][itemID] = n
}

func newSale(t testing.TB, id int64, startsAt time.Time, rate int, qty int64) *flashsale.Sale {
	t.Helper()
	seed := make([]byte, 32)
	if _, err := rand.Read(seed); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(seed)
	return &flashsale.Sale{ID: id, Name: "test", StartsAt: startsAt, AdmissionRatePerSecond: rate,
		ShuffleSeed: seed, ShuffleCommitment: hex.EncodeToString(sum[:]),
		Items: []flashsale.Item{{ID: id*1000 + 1, SaleID: id, ProductID: 501, Quantity: qty, PriceCents: 1999}}}
}

// env is one test's world: Redis, sales, stock, clock and signer, shared by
// any number of rooms ("gateways").
type env struct {
	t      testing.TB
	rdb    redis.UniversalClient
	sales  *fakeSales
	stock  *fakeStock
	clock  *clock
	signer *admission.Signer
	access *auth.Verifier
}

func newEnv(t testing.TB) *env {
	t.Helper()
	s, err := admission.NewSigner(admission.Key{ID: 1, Secret: []byte("admission-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, rdb: testenv.Redis(t), sales: &fakeSales{}, stock: &fakeStock{},
		clock: newClock(time.UnixMilli(1_900_000_000_000)), signer: s}
	e.access = auth.NewVerifier(jwtSecret, auth.WithClock(e.clock.Now))
	return e
}

func (e *env) addSale(s *flashsale.Sale) *flashsale.Sale {
	e.sales.put(s)
	for _, it := range s.Items {
		e.stock.set(s.ID, it.ID, it.Quantity)
	}
	return s
}

// identityToken is an access token with an identity key (the idk claim).
func (e *env) identityToken(user int64, idk string) string {
	e.t.Helper()
	tok, err := auth.MintIdentity(jwtSecret, user, false, idk, time.Hour, e.clock.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

func (e *env) token(user int64) string {
	e.t.Helper()
	tok, err := auth.Mint(jwtSecret, user, false, time.Hour, e.clock.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// gateway is one Room behind its own httptest server.
type gateway struct {
	room *Room
	srv  *httptest.Server
	reg  *prometheus.Registry
}

// newGateway starts a room (Run) and its server; both stop at cleanup.
// testDefaults fills what the tests' gateways share: a 10ms tick, 2ms
// join batches (the tests join one shopper after another: each would
// wait out the batch window), the env's clock, and no opening hold
// unless the test asks for one.
func (e *env) testDefaults(cfg *Config) {
	if cfg.Tick == 0 {
		cfg.Tick = 10 * time.Millisecond
	}
	if cfg.JoinBatchWindow == 0 {
		cfg.JoinBatchWindow = 2 * time.Millisecond
	}
	if cfg.OpeningHold == 0 {
		cfg.OpeningHold = -1
	}
	cfg.Now = e.clock.Now
}

func (e *env) newGateway(cfg Config, guard JoinGuard) *gateway {
	e.t.Helper()
	e.testDefaults(&cfg)
	reg := prometheus.NewRegistry()
	r := New(cfg, e.rdb, e.sales, e.stock, e.access, e.signer, guard, nil, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	srv := httptest.NewServer(r)
	e.t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = r.Shutdown(sctx)
		srv.Close()
		cancel()
		<-done
	})
	return &gateway{room: r, srv: srv, reg: reg}
}

func (g *gateway) url(saleID int64) string {
	return "ws" + strings.TrimPrefix(g.srv.URL, "http") + SalePath + strconv.FormatInt(saleID, 10) + "/queue"
}

// hangBound bounds the waits of the tests' clients and helpers for what a
// gateway does: it only guards against a hang. A gateway on a Redis
// Cluster, with the race detector, on a loaded 2-core machine takes
// seconds for what takes milliseconds alone.
const hangBound = 30 * time.Second

// client is a test WebSocket client.
type client struct {
	t  testing.TB
	ws *websocket.Conn
}

func dial(t testing.TB, url string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangBound)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	ws.SetReadLimit(1 << 20)
	t.Cleanup(func() { _ = ws.CloseNow() })
	return &client{t: t, ws: ws}
}

func (c *client) send(s string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangBound)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, []byte(s)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *client) join(token string) {
	c.t.Helper()
	b, _ := json.Marshal(map[string]string{"type": "join", "accessToken": token})
	c.send(string(b))
}

// msg is any server message.
type msg struct {
	Type           string         `json:"type"`
	State          string         `json:"state"`
	ServerTimeMs   int64          `json:"serverTimeMs"`
	OpensAtMs      int64          `json:"opensAtMs"`
	Position       int64          `json:"position"`
	EtaSeconds     int64          `json:"etaSeconds"`
	AdmissionToken string         `json:"admissionToken"`
	ExpiresAtMs    int64          `json:"expiresAtMs"`
	NotBeforeMs    int64          `json:"notBeforeMs"`
	Items          []AdmittedItem `json:"items"`
	Error          string         `json:"error"`
	Message        string         `json:"message"`
	Text           string         `json:"text"` // type message
	AtMs           int64          `json:"atMs"` // type message
	DrawSecret     string         `json:"drawSecret"`
	ChosenItemID   int64          `json:"chosenItemId"`
}

// read returns the next message, or the read error.
func (c *client) read(timeout time.Duration) (msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, b, err := c.ws.Read(ctx)
	if err != nil {
		return msg{}, err
	}
	var m msg
	if err := json.Unmarshal(b, &m); err != nil {
		c.t.Fatalf("bad server message %q: %v", b, err)
	}
	return m, nil
}

// until reads messages until one satisfies ok.
func (c *client) until(what string, timeout time.Duration, ok func(msg) bool) msg {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m, err := c.read(time.Until(deadline))
		if err != nil {
			c.t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok(m) {
			return m
		}
	}
}

func (c *client) untilState(state string) msg {
	c.t.Helper()
	return c.until("status "+state, hangBound, func(m msg) bool { return m.Type == TypeStatus && m.State == state })
}

// until1 is untilState for another goroutine than the test's: an error
// instead of t.Fatal.
func (c *client) until1(state string, timeout time.Duration) (msg, error) {
	deadline := time.Now().Add(timeout)
	for {
		m, err := c.read(time.Until(deadline))
		if err != nil || (m.Type == TypeStatus && m.State == state) {
			return m, err
		}
	}
}

func (c *client) untilAdmitted() msg {
	c.t.Helper()
	return c.until("admitted", hangBound, func(m msg) bool { return m.Type == TypeAdmitted })
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, timeout, cond)
}

// joinUsers puts users 1…n in the sale's queue through g.
func (g *gateway) joinUsers(t testing.TB, saleID, n int64) {
	t.Helper()
	for u := int64(1); u <= n; u++ {
		if _, err := g.room.Join(context.Background(), flashsale.Principal{UserID: u}, saleID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// admitted is the sale's admission cursor: places admitted so far.
func (g *gateway) admitted(t testing.TB, saleID int64) int64 {
	t.Helper()
	f, err := g.room.Figures(context.Background(), saleID)
	if err != nil {
		t.Fatal(err)
	}
	return f.Admitted
}

// waitTicks waits until the gateway has run n more ticks.
func (g *gateway) waitTicks(t testing.TB, n uint64) {
	t.Helper()
	g.room.mu.Lock()
	target := g.room.tickCount + n + 1
	g.room.mu.Unlock()
	eventually(t, "ticks", hangBound, func() bool {
		g.room.mu.Lock()
		defer g.room.mu.Unlock()
		return g.room.tickCount >= target
	})
}

// waitCheckpoint waits until the sale's saved queue state holds seq
// tickets issued, n in the queue and the cursor at serving.
func waitCheckpoint(t testing.TB, pool *pgxpool.Pool, saleID, seq, n, serving int64) {
	t.Helper()
	eventually(t, "checkpoint", hangBound, func() bool {
		var gotSeq, gotN, gotServing int64
		err := pool.QueryRow(context.Background(), `SELECT seq, n, serving FROM queue_state WHERE sale_id = $1`, saleID).Scan(&gotSeq, &gotN, &gotServing)
		return err == nil && gotSeq == seq && gotN == n && gotServing == serving
	})
}
