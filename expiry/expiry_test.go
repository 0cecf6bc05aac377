package expiry_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/expiry"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/orders"
	"github.com/flashsale/flashsale/sales"
	"github.com/flashsale/flashsale/sales/salestest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const window = 10 * time.Minute

// t0 is "now" for the order service; the workers' clocks are set per test.
var t0 = time.Date(2026, 12, 1, 18, 30, 0, 0, time.UTC)

type fixture struct {
	pool  *pgxpool.Pool
	stock *redisstock.Store
	cache *sales.Cache
	sales *sales.Store
	sale  flashsale.Sale
}

func newFixture(t *testing.T, quantities ...int64) *fixture {
	t.Helper()
	return newShardedFixture(t, 1, quantities...)
}

// newShardedFixture is newFixture with the sale's stock split over shards.
func newShardedFixture(t *testing.T, shards int, quantities ...int64) *fixture {
	t.Helper()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	f := &fixture{pool: testenv.Postgres(t), stock: redisstock.New(rdb)}
	store := sales.NewStore(f.pool, rdb, f.stock, func() time.Time { return t0 })
	f.sale = salestest.CreateSharded(t, store, t0.Add(-time.Hour), 999, shards, quantities...)
	f.sales = store
	f.cache = sales.NewCache(store, rdb, time.Hour, slog.New(slog.DiscardHandler))
	if err := f.cache.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) service(now func() time.Time) *orders.Service {
	return orders.New(orders.Config{PaymentWindow: window, Now: now}, f.pool, f.stock, f.cache, nil)
}

type placed struct {
	id           string
	user, itemID int64
}

// place reserves a unit for each user in Redis (round robin over the items)
// and stores the PENDING orders as the writer does: one row each created at
// created, items.sold raised, pending members confirmed.
func (f *fixture) place(t *testing.T, firstUser int64, n int, created time.Time) []placed {
	t.Helper()
	us := make([]int64, n)
	for i := range us {
		us[i] = firstUser + int64(i)
	}
	return f.placeUsers(t, us, created)
}

// placeUsers is place for the given users.
func (f *fixture) placeUsers(t *testing.T, us []int64, created time.Time) []placed {
	t.Helper()
	ctx := context.Background()
	n := len(us)
	out := make([]placed, n)
	ids, users, items := make([]string, n), make([]int64, n), make([]int64, n)
	pend := make([]redisstock.Pending, n)
	for i := range out {
		p := placed{id: uuid.NewString(), user: us[i], itemID: f.sale.Items[i%len(f.sale.Items)].ID}
		if err := f.stock.Reserve(ctx, f.sale.ID, p.itemID, p.user, p.id, created); err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
		out[i], ids[i], users[i], items[i] = p, p.id, p.user, p.itemID
		pend[i] = redisstock.Pending{SaleID: f.sale.ID, OrderID: p.id, UserID: p.user, ItemID: p.itemID}
	}
	if _, err := f.pool.Exec(ctx, `INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at)
		SELECT o, $2, i, u, 'PENDING', 999, $5, $6 FROM unnest($1::uuid[], $3::bigint[], $4::bigint[]) AS t(o, i, u)`,
		ids, f.sale.ID, items, users, created, created.Add(window)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE items SET sold = sold + c.k
		FROM (SELECT i, count(*) AS k FROM unnest($1::bigint[]) AS t(i) GROUP BY i) c WHERE items.id = c.i`, items); err != nil {
		t.Fatal(err)
	}
	if err := f.stock.Confirm(ctx, pend); err != nil {
		t.Fatal(err)
	}
	return out
}

// state is what the database and Redis say about the sale.
type state struct {
	remaining, sold, live map[int64]int64
	byStatus              map[flashsale.OrderStatus]int
	outbox                int
	buyers                int64
}

func (f *fixture) state(t *testing.T) state {
	t.Helper()
	ctx := context.Background()
	s := state{sold: map[int64]int64{}, live: map[int64]int64{}, byStatus: map[flashsale.OrderStatus]int{}}
	var err error
	if s.remaining, err = f.stock.Remaining(ctx, f.sale.ID); err != nil {
		t.Fatal(err)
	}
	if s.buyers, err = f.stock.BuyerCount(ctx, f.sale.ID); err != nil {
		t.Fatal(err)
	}
	rows, err := f.pool.Query(ctx, `SELECT id, sold FROM items WHERE sale_id = $1`, f.sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, sold int64
		if err := rows.Scan(&id, &sold); err != nil {
			t.Fatal(err)
		}
		s.sold[id] = sold
	}
	rows, err = f.pool.Query(ctx, `SELECT item_id, status, count(*) FROM orders WHERE sale_id = $1 GROUP BY 1, 2`, f.sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var item int64
		var st string
		var n int
		if err := rows.Scan(&item, &st, &n); err != nil {
			t.Fatal(err)
		}
		s.byStatus[flashsale.OrderStatus(st)] += n
		if flashsale.OrderStatus(st).Live() {
			s.live[item] += int64(n)
		}
	}
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM stock_returns`).Scan(&s.outbox); err != nil {
		t.Fatal(err)
	}
	return s
}

// conserved checks invariant 3 per item: Redis remaining + live orders =
// quantity, and items.sold = live orders.
func (f *fixture) conserved(t *testing.T, s state) {
	t.Helper()
	for _, it := range f.sale.Items {
		if got := s.remaining[it.ID] + s.live[it.ID]; got != it.Quantity {
			t.Errorf("item %d: remaining %d + live %d = %d, want quantity %d", it.ID, s.remaining[it.ID], s.live[it.ID], got, it.Quantity)
		}
		if s.sold[it.ID] != s.live[it.ID] {
			t.Errorf("item %d: items.sold %d, live orders %d", it.ID, s.sold[it.ID], s.live[it.ID])
		}
	}
}

// events maps each order of the sale that has order events to their
// types in id order, after checking every body against its row.
func (f *fixture) events(t *testing.T) map[string][]string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT e.order_id::text, e.type,
		(e.body->>'eventId')::int8 = e.id AND e.body->>'orderId' = o.id::text
		AND e.body->>'status' = o.status AND (e.body->>'userId')::int8 = o.user_id
		FROM order_events e JOIN orders o ON o.id = e.order_id
		WHERE o.sale_id = $1 ORDER BY e.id`, f.sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for rows.Next() {
		var id, typ string
		var ok bool
		if err := rows.Scan(&id, &typ, &ok); err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Errorf("order %s: %s event's body disagrees with its row", id, typ)
		}
		out[id] = append(out[id], typ)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func counterValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			if g := mf.GetMetric()[0].GetGauge(); g != nil {
				return g.GetValue()
			}
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// TestParallelWorkers: three workers at once over 500 expired orders return
// every unit exactly once.
func TestParallelWorkers(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 251, 251)
	f.place(t, 1, 500, t0.Add(-window-time.Minute))
	// A paid order and a PENDING one still inside its window stay as they are.
	keep := f.place(t, 1000, 2, t0.Add(-time.Minute))
	svc := f.service(func() time.Time { return t0 })
	if _, err := svc.Pay(ctx, keep[0].user, keep[0].id); err != nil {
		t.Fatal(err)
	}
	before := f.state(t)
	if got := before.remaining[f.sale.Items[0].ID] + before.remaining[f.sale.Items[1].ID]; got != 0 {
		t.Fatalf("remaining before expiry = %d, want 0", got)
	}

	reg := prometheus.NewRegistry()
	workers := make([]*expiry.Worker, 3)
	for i := range workers {
		workers[i] = expiry.New(expiry.Config{BatchSize: 37, Now: func() time.Time { return t0 }}, f.pool, f.stock, svc, nil, nil, reg)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	expired := make([]int, len(workers))
	for i, w := range workers {
		wg.Go(func() {
			<-start
			n, err := w.RunOnce(ctx)
			if err != nil {
				t.Errorf("worker %d: %v", i, err)
			}
			expired[i] = n
		})
	}
	close(start)
	wg.Wait()

	t.Logf("expired per worker: %v", expired)
	total := 0
	for _, n := range expired {
		total += n
	}
	if total != 500 {
		t.Errorf("workers expired %v = %d orders, want 500", expired, total)
	}
	s := f.state(t)
	if s.byStatus[flashsale.OrderExpired] != 500 || s.byStatus[flashsale.OrderPaid] != 1 || s.byStatus[flashsale.OrderPending] != 1 {
		t.Errorf("orders by status = %v, want 500 EXPIRED, 1 PAID, 1 PENDING", s.byStatus)
	}
	if s.outbox != 0 {
		t.Errorf("stock_returns rows = %d, want 0", s.outbox)
	}
	if s.buyers != 2 {
		t.Errorf("Redis buyer records = %d, want 2", s.buyers)
	}
	// 251 + 251 units; the two kept orders hold one unit of each item.
	for i, it := range f.sale.Items {
		if got, want := s.remaining[it.ID], it.Quantity-1; got != want {
			t.Errorf("item %d: remaining %d, want %d", i, got, want)
		}
		if got := s.sold[it.ID]; got != 1 {
			t.Errorf("item %d: sold %d, want 1", i, got)
		}
	}
	f.conserved(t, s)
	evs := f.events(t)
	if len(evs) != 501 { // 500 expired, 1 paid
		t.Errorf("orders with events: %d, want 501", len(evs))
	}
	for id, types := range evs {
		if id != keep[0].id && !slices.Equal(types, []string{"order.expired"}) {
			t.Errorf("order %s: events %v, want one order.expired", id, types)
		}
	}
	if got := counterValue(t, reg, "flashsale_expiry_orders_total"); got != 500 {
		t.Errorf("flashsale_expiry_orders_total = %v, want 500", got)
	}
	if got := counterValue(t, reg, "flashsale_expiry_stock_returned_total"); got != 500 {
		t.Errorf("flashsale_expiry_stock_returned_total = %v, want 500", got)
	}

	// Another round finds nothing more to do.
	if n, err := workers[0].RunOnce(ctx); err != nil || n != 0 {
		t.Errorf("second round expired %d (err %v), want 0", n, err)
	}
	// Once its window passes, the pending order expires too; the paid one
	// never does.
	later := expiry.New(expiry.Config{Now: func() time.Time { return t0.Add(window) }}, f.pool, f.stock, svc, nil, nil, nil)
	if n, err := later.RunOnce(ctx); err != nil || n != 1 {
		t.Errorf("later round expired %d (err %v), want 1", n, err)
	}
	s = f.state(t)
	f.conserved(t, s)
	if s.byStatus[flashsale.OrderPaid] != 1 || s.byStatus[flashsale.OrderExpired] != 501 {
		t.Errorf("orders by status = %v, want 501 EXPIRED, 1 PAID", s.byStatus)
	}
}

// TestShardedExpiryReturnsUnitsWhereTheyCameFrom: users all homed on one
// shard bought the units of every shard; their expiry gives each unit
// back to the shard it came from, so the shards hold what they held.
func TestShardedExpiryReturnsUnitsWhereTheyCameFrom(t *testing.T) {
	ctx := context.Background()
	const shards = 3
	f := newShardedFixture(t, shards, 6) // 2 units per shard
	var users []int64
	for u := int64(1); len(users) < 6; u++ {
		if f.stock.HomeShard(f.sale.ID, u) == 0 {
			users = append(users, u)
		}
	}
	f.placeUsers(t, users, t0.Add(-window-time.Minute))
	item := f.sale.Items[0].ID
	for sh := range shards {
		if m, err := f.stock.ShardRemaining(ctx, f.sale.ID, sh); err != nil || m[item] != 0 {
			t.Fatalf("shard %d before expiry: %v %v, want 0 units", sh, m, err)
		}
	}
	w := expiry.New(expiry.Config{Now: func() time.Time { return t0 }}, f.pool, f.stock, f.service(func() time.Time { return t0 }), nil, nil, nil)
	if n, err := w.RunOnce(ctx); err != nil || n != 6 {
		t.Fatalf("RunOnce = %d, %v; want 6", n, err)
	}
	for sh := range shards {
		if m, err := f.stock.ShardRemaining(ctx, f.sale.ID, sh); err != nil || m[item] != 2 {
			t.Errorf("shard %d after expiry: %v %v, want 2 units", sh, m, err)
		}
	}
	s := f.state(t)
	f.conserved(t, s)
	if s.buyers != 0 || s.outbox != 0 || s.byStatus[flashsale.OrderExpired] != 6 {
		t.Errorf("buyers %d, outbox %d, by status %v; want 0, 0, 6 EXPIRED", s.buyers, s.outbox, s.byStatus)
	}
}

// deadStore is a stock store on a redis-server that has been stopped.
func deadStore(t *testing.T) *redisstock.Store {
	t.Helper()
	r := testenv.NewRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	return redisstock.New(rdb)
}

// TestRedisDownAfterCommit: the batch commits while Redis is unreachable for
// the release step. The outbox keeps the rows; a later drain returns each
// unit exactly once.
func TestRedisDownAfterCommit(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 10)
	f.place(t, 1, 4, t0.Add(-window-time.Minute))
	item := f.sale.Items[0].ID

	clock := t0
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	svc := f.service(now)
	reg := prometheus.NewRegistry()
	crashed := expiry.New(expiry.Config{Now: now}, f.pool, deadStore(t), nil, nil, nil, reg)
	n, err := crashed.RunOnce(ctx)
	if err == nil || n != 4 {
		t.Fatalf("RunOnce with Redis down = %d, %v; want 4 and an error", n, err)
	}
	s := f.state(t)
	if s.byStatus[flashsale.OrderExpired] != 4 || s.outbox != 4 || s.sold[item] != 0 || s.remaining[item] != 6 {
		t.Fatalf("after the failed release: %+v; want 4 EXPIRED, 4 outbox rows, sold 0, remaining 6", s)
	}
	if got := counterValue(t, reg, "flashsale_expiry_stock_returned_total"); got != 0 {
		t.Errorf("stock_returned_total = %v, want 0", got)
	}

	// A healthy worker with the drainer and the default stale bound: the
	// rows are young, so it leaves them (their own writer may still be
	// releasing them).
	hreg := prometheus.NewRegistry()
	healthy := expiry.New(expiry.Config{Now: now}, f.pool, f.stock, svc, nil, nil, hreg)
	if n, err := healthy.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("healthy round = %d, %v", n, err)
	}
	if s := f.state(t); s.outbox != 4 || s.remaining[item] != 6 {
		t.Fatalf("young rows drained early: outbox %d, remaining %d", s.outbox, s.remaining[item])
	}
	if got := counterValue(t, hreg, "flashsale_expiry_stock_returns_waiting"); got != 4 {
		t.Errorf("stock_returns_waiting = %v, want the 4 rows", got)
	}
	// Past the stale bound (5 s: a killed worker's units are soon on sale
	// again), two workers drain at once; each unit comes back once.
	mu.Lock()
	clock = clock.Add(6 * time.Second)
	mu.Unlock()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if _, err := healthy.RunOnce(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	s = f.state(t)
	if s.outbox != 0 || s.remaining[item] != 10 || s.buyers != 0 {
		t.Fatalf("after drain: outbox %d, remaining %d, buyers %d; want 0, 10, 0", s.outbox, s.remaining[item], s.buyers)
	}
	f.conserved(t, s)
	if got := counterValue(t, hreg, "flashsale_expiry_stock_returns_waiting"); got != 0 {
		t.Errorf("stock_returns_waiting after the drain = %v, want 0", got)
	}
	if got := counterValue(t, hreg, "flashsale_expiry_stock_returns_oldest_seconds"); got != 0 {
		t.Errorf("stock_returns_oldest_seconds after the drain = %v, want 0", got)
	}
	// Draining again gives nothing back.
	if n, err := svc.DrainReturns(ctx, 0, 100); err != nil || n != 0 {
		t.Fatalf("drain again = %d, %v", n, err)
	}
	if r := f.state(t).remaining[item]; r != 10 {
		t.Fatalf("remaining = %d, want 10", r)
	}
}

// TestConcurrentPayCancelExpire: pay, cancel and the expiry worker race on one
// order; exactly one wins and the stock comes back at most once.
func TestConcurrentPayCancelExpire(t *testing.T) {
	ctx := context.Background()
	const rounds = 15
	f := newFixture(t, rounds)
	item := f.sale.Items[0].ID
	// The service still sees the order inside its window; the worker's
	// clock is past it, so all three transitions are possible.
	svc := f.service(func() time.Time { return t0 })
	w := expiry.New(expiry.Config{Now: func() time.Time { return t0.Add(window) }}, f.pool, f.stock, svc, nil, nil, nil)
	outcomes := map[flashsale.OrderStatus]int{}
	for r := range rounds {
		o := f.place(t, int64(r+1), 1, t0.Add(-time.Minute))[0]
		var wg sync.WaitGroup
		start := make(chan struct{})
		var payErr, cancelErr, runErr error
		var expired int
		wg.Go(func() { <-start; _, payErr = svc.Pay(ctx, o.user, o.id) })
		wg.Go(func() { <-start; _, cancelErr = svc.Cancel(ctx, o.user, o.id) })
		wg.Go(func() { <-start; expired, runErr = w.RunOnce(ctx) })
		close(start)
		wg.Wait()
		if runErr != nil {
			t.Fatal(runErr)
		}
		var st string
		if err := f.pool.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, o.id).Scan(&st); err != nil {
			t.Fatal(err)
		}
		status := flashsale.OrderStatus(st)
		outcomes[status]++
		var wantPay, wantCancel flashsale.Code
		wantExpired := 0
		switch status {
		case flashsale.OrderPaid:
			wantCancel = flashsale.CodeOrderPaid
		case flashsale.OrderCancelled:
			wantPay = flashsale.CodeOrderCancelled
		case flashsale.OrderExpired:
			wantPay, wantCancel, wantExpired = flashsale.CodeOrderExpired, flashsale.CodeOrderExpired, 1
		default:
			t.Fatalf("round %d: status %s", r, status)
		}
		if got := flashsale.ErrorCode(payErr); got != wantPay {
			t.Errorf("round %d (%s): pay %q, want %q", r, status, got, wantPay)
		}
		if got := flashsale.ErrorCode(cancelErr); got != wantCancel {
			t.Errorf("round %d (%s): cancel %q, want %q", r, status, got, wantCancel)
		}
		if expired != wantExpired {
			t.Errorf("round %d (%s): worker expired %d, want %d", r, status, expired, wantExpired)
		}
		s := f.state(t)
		f.conserved(t, s)
		if s.outbox != 0 {
			t.Errorf("round %d: outbox %d rows", r, s.outbox)
		}
		if got, want := f.events(t)[o.id], []string{"order." + strings.ToLower(st)}; !slices.Equal(got, want) {
			t.Errorf("round %d: events %v, want %v (the winner's only)", r, got, want)
		}
	}
	t.Logf("outcomes: %v", outcomes)
	s := f.state(t)
	if got, want := s.remaining[item], int64(rounds-outcomes[flashsale.OrderPaid]); got != want {
		t.Errorf("remaining %d, want %d", got, want)
	}
}

// TestRun: Run expires on its interval and returns nil when ctx ends.
func TestRun(t *testing.T) {
	f := newFixture(t, 5)
	f.place(t, 1, 3, t0.Add(-window-time.Minute))
	w := expiry.New(expiry.Config{Interval: time.Hour, Now: func() time.Time { return t0 }}, f.pool, f.stock, f.service(func() time.Time { return t0 }), nil, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	// The first round runs at start; wait for its effect, not for a time.
	testenv.Eventually(t, "the orders expired by the first round", 20*time.Second, func() bool {
		s := f.state(t)
		return s.byStatus[flashsale.OrderExpired] == 3 && s.outbox == 0 && s.remaining[f.sale.Items[0].ID] == 5
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	s := f.state(t)
	f.conserved(t, s)
	if s.remaining[f.sale.Items[0].ID] != 5 {
		t.Errorf("remaining %d, want 5", s.remaining[f.sale.Items[0].ID])
	}
}

// TestRunRetriesStockAdds: a stock addition committed but not applied to
// Redis (the process stopped, or Redis failed, after the commit) is
// applied by a running worker within about a second, once, and its
// outbox row goes. The sale cache of every role used to do it.
func TestRunRetriesStockAdds(t *testing.T) {
	f := newFixture(t, 5)
	item := f.sale.Items[0].ID
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `INSERT INTO stock_adds (sale_id, item_id, units) VALUES ($1, $2, 3)`, f.sale.ID, item); err != nil {
		t.Fatal(err)
	}
	w := expiry.New(expiry.Config{Interval: time.Hour, Now: func() time.Time { return t0 }}, f.pool, f.stock, nil, f.sales, nil, nil)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	defer func() { cancel(); <-done }()
	left := func() int {
		var n int
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM stock_adds`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, "the stock addition applied", 30*time.Second, func() bool { return left() == 0 })
	if rem := f.state(t).remaining[item]; rem != 8 {
		t.Fatalf("remaining %d, want 8 (5 + the 3 added, once)", rem)
	}
}
