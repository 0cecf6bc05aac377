package wiring_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/lua"
)

// queueSale creates a sale allocated in queue order (named explicitly)
// of one item and returns its id and the item's.
func (s *stack) queueSale(opens time.Time, units, windowSeconds int) (int64, int64) {
	s.T.Helper()
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": "holds", "startsAt": opens.UTC().Format(time.RFC3339Nano), "admissionRatePerSecond": 1,
		"allocation": "queue", "claimWindowSeconds": windowSeconds,
		"items": []map[string]any{{"productId": 501, "quantity": units, "priceCents": 1999}},
	})
	s.Want(r, 201, "")
	return int64(r.Body["id"].(float64)), int64(r.Body["items"].([]any)[0].(map[string]any)["id"].(float64))
}

// pollHold is a shopper's polling status: its token ("" when not
// admitted) and holdUntilMs.
func (s *stack) pollHold(saleID, user int64) (string, int64, apptest.Resp) {
	s.T.Helper()
	a := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID), s.Token(user, false), nil)
	s.Want(a, 200, "")
	tok, _ := a.Body["admissionToken"].(string)
	until, _ := a.Body["holdUntilMs"].(float64)
	return tok, int64(until), a
}

// TestQueueOrderPauseExtendsHolds: in queue order a pause stops the hold
// clocks. Two units are held for ranks 0 (WebSocket) and 1 (polling) from
// the opening for 10 s (every shopper is on a WebSocket); the operator pauses the sale 2 s in and resumes
// it after both windows would have ended. At the resume nothing lapses:
// both holds end later by the pause's length, rank 0 gets a fresh
// admitted message (token, holdUntilMs) and buys with it after its first
// window's end, rank 1's poll shows the new end, and rank 1's unused
// hold lapses at that end, not before, and goes to rank 2.
func TestQueueOrderPauseExtendsHolds(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	s := startStack(t)
	const window = 10
	opens := time.Now().Add(3 * time.Second)
	saleID, item := s.queueSale(opens, 2, window)
	ws := map[int64]*wsShopper{}
	for u := int64(600); u < 604; u++ {
		ws[u] = joinWS(t, s, saleID, u)
		ws[u].waitFor("the pre-queue", isState("PREQUEUE"))
	}
	rank := drawRanks(t, s.Stack, saleID, 4)
	byRank := map[int]int64{}
	for u, r := range rank {
		byRank[r] = u
	}
	// Rank 0 is watched on its WebSocket, rank 1 by polling.
	buyer, poller, next := byRank[0], byRank[1], byRank[2]
	w := ws[buyer]
	first := w.waitFor("the admitted message", isType("admitted"))
	w.mu.Lock()
	until0 := int64(w.msgs[first]["holdUntilMs"].(float64))
	tok0 := w.msgs[first]["admissionToken"].(string)
	w.mu.Unlock()
	if want := opens.Add(window * time.Second).UnixMilli(); until0 < want-1000 || until0 > want+1000 {
		t.Fatalf("holdUntilMs %d, want the opening plus the window, %d", until0, want)
	}
	var pollUntil0 int64
	waitFor(t, "the second hold", func() bool {
		var tok string
		tok, pollUntil0, _ = s.pollHold(saleID, poller)
		return tok != ""
	})

	waitUntil(opens.Add(2 * time.Second))
	pausedAt := time.Now()
	s.Want(s.control(saleID, "pause", nil), 200, "")
	// Both windows end during the pause.
	waitUntil(time.UnixMilli(until0).Add(2 * time.Second))
	r := s.purchase(buyer, item, tok0)
	if r.Status == 202 {
		t.Fatalf("bought while paused: %s", r.Raw)
	}
	s.Want(s.control(saleID, "resume", nil), 200, "")
	paused := time.Since(pausedAt)

	// A fresh admitted message with the window moved by the pause.
	again := w.waitFor("a second admitted message", func(m map[string]any) bool {
		u, _ := m["holdUntilMs"].(float64)
		return m["type"] == "admitted" && int64(u) > until0
	})
	w.mu.Lock()
	m := w.msgs[again]
	w.mu.Unlock()
	until1 := int64(m["holdUntilMs"].(float64))
	if moved := time.Duration(until1-until0) * time.Millisecond; moved < paused-1500*time.Millisecond || moved > paused+500*time.Millisecond {
		t.Fatalf("holdUntilMs moved by %v, want about the pause's %v", moved, paused)
	}
	if m["expiresAtMs"] != m["holdUntilMs"] {
		t.Fatalf("admitted message %v: the token must expire at holdUntilMs", m)
	}
	// The polling holder sees the same move, and nobody new holds a unit.
	tok1, pollUntil1, a := s.pollHold(saleID, poller)
	if tok1 == "" || pollUntil1-pollUntil0 != until1-until0 {
		t.Fatalf("polling holder after the resume: %s; want holdUntilMs %d", a.Raw, pollUntil0+until1-until0)
	}
	if tok, _, a := s.pollHold(saleID, next); tok != "" {
		t.Fatalf("rank 2 admitted at the resume: %s", a.Raw)
	}
	// Rank 0 buys after its first window's end, with the new token.
	if time.Now().UnixMilli() <= until0 {
		t.Fatal("resumed before the first window's end: the test proves nothing")
	}
	s.Want(s.purchase(buyer, item, m["admissionToken"].(string)), 202, "")

	// Rank 1's hold lapses at its extended end, not before.
	waitFor(t, "rank 1's unit held for rank 2", func() bool {
		tok, _, _ := s.pollHold(saleID, next)
		if tok == "" {
			if tok, _, _ := s.pollHold(saleID, poller); tok == "" && time.Now().UnixMilli() < pollUntil1 {
				t.Fatalf("rank 1 lost its hold before its extended end")
			}
		}
		return tok != ""
	})
	if now := time.Now().UnixMilli(); now < pollUntil1 {
		t.Fatalf("rank 2 held a unit at %d, before rank 1's extended end %d", now, pollUntil1)
	}
	s.Want(s.purchase(poller, item, tok1), 403, "NOT_ADMITTED")
}

// TestQueueOrderHoldsAfterRedisLoss: in queue order, three units are held
// for ranks 0-2 (all on WebSockets) for 40 s; rank 0 buys. Then
// redis-server is killed and started empty: the holds are gone with the
// stock. Once the stock is rebuilt from the orders, the leader holds a
// unit again for ranks 1 and 2 before anyone else, until their first
// windows' end: both buy with the tokens they had; rank 0, who bought
// before the loss, gets no second unit; ranks 3 and 4 get none; the sale
// sells exactly its three units. Rank 1 tries once while the holds are
// gone and is refused; as the page would, it then waits for its turn,
// and a fresh admitted message tells it the unit is held again.
func TestQueueOrderHoldsAfterRedisLoss(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	rr := ownRedis(t)
	s := startStack(t, func(c *wiring.Config) { c.RedisURL, c.RedisCluster = rr.srv.URL, nil })
	const window, units = 40, 3
	opens := time.Now().Add(3 * time.Second)
	saleID, item := s.queueSale(opens, units, window)
	ws := map[int64]*wsShopper{}
	for u := int64(700); u < 705; u++ {
		ws[u] = joinWS(t, s, saleID, u)
		ws[u].waitFor("the pre-queue", isState("PREQUEUE"))
	}
	rank := drawRanks(t, s.Stack, saleID, 5)
	byRank := map[int]int64{}
	for u, r := range rank {
		byRank[r] = u
	}
	tokens := map[int64]string{}
	for r := range units {
		w := ws[byRank[r]]
		i := w.waitFor("the admitted message", isType("admitted"))
		w.mu.Lock()
		tokens[byRank[r]] = w.msgs[i]["admissionToken"].(string)
		w.mu.Unlock()
	}
	waitUntil(opens)
	var bought apptest.Resp
	waitFor(t, "rank 0's purchase", func() bool {
		bought = s.purchase(byRank[0], item, tokens[byRank[0]])
		return bought.Status != 403 // a moment before this gateway's opening
	})
	s.Want(bought, 202, "")
	s.waitPayable(byRank[0], bought.Body["orderId"].(string))

	before := ws[byRank[1]].count(isType("admitted"))
	rr.restartEmpty()
	lost := time.Now()
	if got := s.purchase(byRank[1], item, tokens[byRank[1]]); got.Status == 202 {
		t.Fatalf("rank 1 bought before the holds were rebuilt: %s", got.Raw)
	}
	waitFor(t, "rank 1 told again that a unit is held", func() bool {
		return ws[byRank[1]].count(isType("admitted")) > before
	})

	// Ranks 1 and 2 buy with the tokens they had, once the stock is back
	// (503 until then; NOT_ADMITTED for at most the tick that rebuilds
	// the holds).
	for r := 1; r < units; r++ {
		u := byRank[r]
		var got apptest.Resp
		waitFor(t, fmt.Sprintf("rank %d's purchase after the loss", r), func() bool {
			got = s.purchase(u, item, tokens[u])
			return got.Status != 503 && !(got.Status == 403 && got.Body["error"] == "NOT_ADMITTED")
		})
		s.Want(got, 202, "")
	}
	if time.Since(opens) > window*time.Second {
		t.Fatal("bought after the first windows' end: the test proves nothing")
	}
	t.Logf("holds rebuilt and bought %v after the loss", time.Since(lost))
	// Rank 0 bought before the loss: no second unit.
	s.Want(s.purchase(byRank[0], item, tokens[byRank[0]]), 409, "ALREADY_PURCHASED")
	for r := units; r < 5; r++ {
		u := byRank[r]
		if tok, _, a := s.pollHold(saleID, u); tok != "" {
			t.Fatalf("rank %d admitted with every unit sold: %s", r, a.Raw)
		}
		if got := s.purchase(u, item, "none"); got.Status == 202 {
			t.Fatalf("rank %d bought: %s", r, got.Raw)
		}
	}
	waitFor(t, "the figures", func() bool {
		f := s.figures(saleID)
		return itemFigure(t, f, item, "sold") == units && itemFigure(t, f, item, "remaining") == 0
	})
}

// TestQueueOrderPauseLeaderChange: the gateway that leads a queue sale
// sees the pause and dies during it; another gateway takes the lead and
// sees the resume. The holds are extended by the whole pause, once: the
// holder buys after its first window's end, through the new leader, and
// the other holder's hold lapses at its extended end.
func TestQueueOrderPauseLeaderChange(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	// Gateway a alone first, so that it leads the sale; b joins later.
	var shared wiring.Config
	a, kill := killableStack(t, func(c *wiring.Config) { shared = *c })
	const window = 10
	opens := time.Now().Add(3 * time.Second)
	saleID, item := a.queueSale(opens, 2, window)
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	for u := int64(800); u < 803; u++ {
		a.Want(a.Do("POST", queue, a.Token(u, false), nil), 200, "")
	}
	rank := drawRanks(t, a.Stack, saleID, 3)
	byRank := map[int]int64{}
	for u, r := range rank {
		byRank[r] = u
	}
	var until0, other0 int64
	waitFor(t, "both holds", func() bool {
		t0, u0, _ := a.pollHold(saleID, byRank[0])
		t1, u1, _ := a.pollHold(saleID, byRank[1])
		until0, other0 = u0, u1
		return t0 != "" && t1 != ""
	})
	b := startStack(t, func(c *wiring.Config) {
		c.RedisURL, c.RedisCluster, c.DatabaseURL, c.KafkaBrokers = shared.RedisURL, shared.RedisCluster, shared.DatabaseURL, shared.KafkaBrokers
	})
	b.waitSale(saleID)

	waitUntil(opens.Add(time.Second))
	pausedAt := time.Now()
	b.Want(b.control(saleID, "pause", nil), 200, "")
	// a (the leader) records the pause, then dies.
	waitUntil(pausedAt.Add(3 * time.Second))
	kill()
	waitUntil(time.UnixMilli(until0).Add(2 * time.Second))
	b.Want(b.control(saleID, "resume", nil), 200, "")
	paused := time.Since(pausedAt)

	var tok string
	var until1 int64
	waitFor(t, "the hold extended by the new leader", func() bool {
		tok, until1, _ = b.pollHold(saleID, byRank[0])
		return tok != "" && until1 > until0
	})
	if moved := time.Duration(until1-until0) * time.Millisecond; moved < paused-1500*time.Millisecond || moved > paused+500*time.Millisecond {
		t.Fatalf("holdUntilMs moved by %v, want about the pause's %v", moved, paused)
	}
	_, other1, _ := b.pollHold(saleID, byRank[1])
	if other1-other0 != until1-until0 {
		t.Fatalf("the other hold moved by %d ms, want %d", other1-other0, until1-until0)
	}
	b.Want(b.purchase(byRank[0], item, tok), 202, "")
	waitFor(t, "rank 1's unit held for rank 2", func() bool {
		tok, _, _ := b.pollHold(saleID, byRank[2])
		return tok != ""
	})
	if now := time.Now().UnixMilli(); now < other1 {
		t.Fatalf("rank 2 held a unit at %d, before rank 1's extended end %d", now, other1)
	}
}

// killableStack is startStack with a way to close the stack before the
// test ends (once: the test's cleanup closes it otherwise).
func killableStack(t *testing.T, mutate ...func(*wiring.Config)) (*stack, func()) {
	t.Helper()
	cfg := wiring.Defaults()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	rc := testenv.RedisConfig(t)
	cfg.RedisURL, cfg.RedisCluster = rc.URL, rc.Cluster
	cfg.DatabaseURL = testenv.DatabaseURL(t)
	cfg.KafkaBrokers = testenv.NewKafka(t).Brokers
	cfg.JWTSecret = apptest.Secret
	cfg.ExpiryInterval = 200 * time.Millisecond
	cfg.DrawLead, cfg.OpeningHold, cfg.MaxPendingConnsPerAddr = 0, -1, -1
	for _, m := range mutate {
		m(&cfg)
	}
	a, err := wiring.Start(context.Background(), cfg, wiring.AllRoles, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	var once sync.Once
	kill := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := a.Close(ctx); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	t.Cleanup(kill)
	if err := a.SetDefense(context.Background(), "test", []byte(apptest.Permissive)); err != nil {
		t.Fatalf("settings: %v", err)
	}
	return &stack{&apptest.Stack{T: t, App: a, Config: cfg, Client: &http.Client{Timeout: 10 * time.Second}}}, kill
}

// restartable is a redis-server of one test, which it may kill and start
// again empty on the same port.
type restartable struct {
	t   *testing.T
	srv *localsvc.Redis
}

// ownRedis starts a redis-server for the test. Register it before the
// stack that uses it: the server running at the end stops after the
// stack has closed.
func ownRedis(t *testing.T) *restartable {
	t.Helper()
	r := &restartable{t: t, srv: testenv.NewRedisServer(t)}
	first := r.srv
	t.Cleanup(func() {
		if r.srv != first {
			_ = r.srv.Stop()
		}
	})
	return r
}

// restartEmpty kills redis-server (kill -9: nothing saved) and starts an
// empty one on the same port.
func (r *restartable) restartEmpty() {
	r.t.Helper()
	r.srv.Kill()
	port, err := strconv.Atoi(r.srv.Addr[strings.LastIndexByte(r.srv.Addr, ':')+1:])
	if err != nil {
		r.t.Fatal(err)
	}
	srv, err := localsvc.StartRedis(context.Background(), localsvc.RedisOptions{Dir: r.t.TempDir(), Port: port})
	if err != nil {
		r.t.Fatal(err)
	}
	r.srv = srv
}

// TestQueueOrderHoldsShortAfterRedisLoss: two units held for ranks 0 and
// 1 (on WebSockets), and a live order in the database that Redis never
// counted (a stand-in for more admitted shoppers than the rebuilt stock);
// redis-server restarts empty. (Before the loss, a rebuild pass with
// every unit held leaves both holds and admissions as they are.) The stock is rebuilt with one unit: rank 0
// is held again first and buys; rank 1 cannot be, and is told (its
// admission ends, it goes back in line: WAITING or SOLD_OUT), and its
// purchase is refused.
func TestQueueOrderHoldsShortAfterRedisLoss(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	rr := ownRedis(t)
	s := startStack(t, func(c *wiring.Config) { c.RedisURL, c.RedisCluster = rr.srv.URL, nil })
	const window, units = 40, 2
	opens := time.Now().Add(3 * time.Second)
	saleID, item := s.queueSale(opens, units, window)
	ws := map[int64]*wsShopper{}
	for u := int64(900); u < 903; u++ {
		ws[u] = joinWS(t, s, saleID, u)
		ws[u].waitFor("the pre-queue", isState("PREQUEUE"))
	}
	rank := drawRanks(t, s.Stack, saleID, 3)
	byRank := map[int]int64{}
	for u, r := range rank {
		byRank[r] = u
	}
	tokens := map[int64]string{}
	admittedAt := map[int64]int{}
	for r := range units {
		w := ws[byRank[r]]
		i := w.waitFor("the admitted message", isType("admitted"))
		w.mu.Lock()
		tokens[byRank[r]], admittedAt[byRank[r]] = w.msgs[i]["admissionToken"].(string), i
		w.mu.Unlock()
	}
	// A rebuild pass while the holds are all there (every unit held)
	// takes nobody's unit or admission away.
	rdb, err := redisconn.New(redisconn.Config{URL: s.Config.RedisURL})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	state := lua.QueueKey(saleID, "state")
	untils := map[int64]int64{}
	for r := range units {
		_, untils[byRank[r]], _ = s.pollHold(saleID, byRank[r])
	}
	if err := rdb.HSet(context.Background(), state, "holdslost", 1).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rebuild pass", func() bool {
		n, err := rdb.HExists(context.Background(), state, "holdslost").Result()
		return err == nil && !n
	})
	for r := range units {
		u := byRank[r]
		if tok, until, a := s.pollHold(saleID, u); tok == "" || until != untils[u] {
			t.Fatalf("rank %d after a rebuild pass with its hold there: %s", r, a.Raw)
		}
	}
	pg, err := pgxpool.New(context.Background(), s.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	if _, err := pg.Exec(context.Background(), `INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at)
		VALUES (gen_random_uuid(), $1, $2, 999, 'PENDING', 1999, now(), now() + interval '1 hour')`, saleID, item); err != nil {
		t.Fatal(err)
	}
	waitUntil(opens)
	rr.restartEmpty()

	first, second := byRank[0], byRank[1]
	var got apptest.Resp
	waitFor(t, "rank 0's purchase after the loss", func() bool {
		got = s.purchase(first, item, tokens[first])
		return got.Status != 503 && !(got.Status == 403 && got.Body["error"] == "NOT_ADMITTED")
	})
	s.Want(got, 202, "")
	w := ws[second]
	waitFor(t, "rank 1 told it holds nothing", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, m := range w.msgs[admittedAt[second]+1:] {
			if m["type"] == "status" && (m["state"] == "WAITING" || m["state"] == "SOLD_OUT") {
				return true
			}
		}
		return false
	})
	s.Want(s.purchase(second, item, tokens[second]), 403, "NOT_ADMITTED")
	if tok, _, a := s.pollHold(saleID, byRank[2]); tok != "" {
		t.Fatalf("rank 2 admitted with no unit left: %s", a.Raw)
	}
	f := s.figures(saleID)
	if sold, rem := itemFigure(t, f, item, "sold"), itemFigure(t, f, item, "remaining"); sold != units || rem != 0 {
		t.Fatalf("sold %d, remaining %d; want %d and 0", sold, rem, units)
	}
}

// TestQueueOrderHoldIsNoOrder: a unit held for a shopper at their turn is
// not an order. A shopper whose purchase answer was lost looks for their
// order in the sale: while they only hold the unit, there is none (404),
// so they buy again and get it; after the purchase the lookup finds it.
// (Before, the lookup answered the hold as a PENDING order that never
// became payable, and the shopper stopped buying until the hold lapsed.)
func TestQueueOrderHoldIsNoOrder(t *testing.T) {
	s := startStack(t)
	saleID, item := s.queueSale(time.Now().Add(2*time.Second), 1, 60)
	token := s.admit(700, saleID)
	if _, until, _ := s.pollHold(saleID, 700); until == 0 {
		t.Fatal("admitted without a hold")
	}
	path := fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID)
	s.Want(s.Do("GET", path, s.Token(700, false), nil), 404, "NOT_FOUND")
	r := s.purchase(700, item, token)
	s.Want(r, 202, "")
	got := s.Do("GET", path, s.Token(700, false), nil)
	s.Want(got, 200, "")
	if got.Body["orderId"] != r.Body["orderId"] {
		t.Errorf("the sale's order after the purchase: %v; want %v", got.Body, r.Body["orderId"])
	}
}
