package reconcile

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/purchase"
)

// insertOrder stores an order row the way the writer does (live orders count
// in items.sold).
func insertOrder(t *testing.T, e *env, id string, itemID, user int64, status flashsale.OrderStatus) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, 1999, $6, $7)`, id, e.sale.ID, itemID, user, string(status), t0, t0.Add(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if status.Live() {
		if _, err := e.pool.Exec(ctx, `UPDATE items SET sold = sold + 1 WHERE id = $1`, itemID); err != nil {
			t.Fatal(err)
		}
	}
}

func assertOrder(t *testing.T, pool *pgxpool.Pool, id string, want flashsale.OrderStatus) {
	t.Helper()
	var status string
	if err := pool.QueryRow(context.Background(), `SELECT status FROM orders WHERE id = $1`, id).Scan(&status); err != nil {
		t.Fatalf("order %s: %v", id, err)
	}
	if flashsale.OrderStatus(status) != want {
		t.Errorf("order %s is %s, want %s", id, status, want)
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A reservation whose publish never happened (the gateway died between
// Redis and Kafka) comes back once it is older than the bound, and only then.
func TestReconcilerReturnsLostReservation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5)
	ctx := context.Background()
	clk := newClock(t0)
	item := e.item(0)
	id := uuid.NewString()
	if err := e.st.Reserve(ctx, e.sale.ID, item.ID, 77, id, t0); err != nil {
		t.Fatal(err)
	}
	r := New(Config{Now: clk.now, PaymentWindow: 10 * time.Minute}, e.pool, e.st, e, nil, nil)

	clk.add(time.Minute)
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("RunOnce before the bound = %d, %v; want 0", n, err)
	}
	if _, ok := e.buyer(t, 77); !ok {
		t.Fatal("reservation returned before the bound")
	}

	clk.add(2 * time.Minute)
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce after the bound = %d, %v; want 1", n, err)
	}
	if got := e.remaining(t, item); got != 5 {
		t.Errorf("remaining %d, want 5", got)
	}
	if _, ok := e.buyer(t, 77); ok {
		t.Error("buyer record left")
	}
	if n := e.pending(t); n != 0 {
		t.Errorf("%d pending left, want 0", n)
	}
	var status, reason string
	var created, expires time.Time
	if err := e.pool.QueryRow(ctx, `SELECT status, reject_reason, created_at, expires_at FROM orders WHERE id = $1`, id).
		Scan(&status, &reason, &created, &expires); err != nil {
		t.Fatal(err)
	}
	if status != "REJECTED" || reason != RejectLost || !created.Equal(t0) || !expires.Equal(t0.Add(10*time.Minute)) {
		t.Errorf("tombstone = %s %q %v %v, want REJECTED %q %v %v", status, reason, created, expires, RejectLost, t0, t0.Add(10*time.Minute))
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM stock_returns`); n != 0 {
		t.Errorf("%d outbox rows left, want 0", n)
	}
	if n := countRows(t, e.pool, `SELECT sold FROM items WHERE id = $1`, item.ID); n != 0 {
		t.Errorf("items.sold = %d, want 0", n)
	}
	wantRejectedEvent := func() {
		t.Helper()
		if n := countRows(t, e.pool, `SELECT count(*) FROM order_events WHERE order_id = $1`, id); n != 1 {
			t.Errorf("%d events of the tombstoned order, want 1", n)
		}
		if n := countRows(t, e.pool, `SELECT count(*) FROM order_events WHERE order_id = $1 AND type = 'order.rejected'
			AND (body->>'eventId')::int8 = id AND body->>'status' = 'REJECTED' AND body->>'reason' = $2
			AND body->>'userId' = '77' AND (body->>'occurredAt')::timestamptz = $3`, id, RejectLost, clk.now()); n != 1 {
			t.Errorf("no order.rejected event with reason %s, user \"77\", at the reconciler's clock", RejectLost)
		}
	}
	wantRejectedEvent()
	// Nothing more to do; the user may buy again.
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Errorf("third RunOnce = %d, %v; want 0", n, err)
	}
	wantRejectedEvent()
	if err := e.st.Reserve(ctx, e.sale.ID, item.ID, 77, uuid.NewString(), clk.now()); err != nil {
		t.Errorf("buying again: %v", err)
	}
}

// The writer stored the order and died before confirming it in Redis: the
// reconciler confirms, gives nothing back.
func TestReconcilerConfirmsStoredOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5)
	ctx := context.Background()
	clk := newClock(t0)
	item := e.item(0)
	id := uuid.NewString()
	if err := e.st.Reserve(ctx, e.sale.ID, item.ID, 8, id, t0); err != nil {
		t.Fatal(err)
	}
	insertOrder(t, e, id, item.ID, 8, flashsale.OrderPending)
	r := New(Config{Now: clk.now}, e.pool, e.st, e, nil, nil)
	clk.add(time.Hour)
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("RunOnce = %d, %v; want 0 returned", n, err)
	}
	if n := e.pending(t); n != 0 {
		t.Errorf("%d pending left, want 0 (confirmed)", n)
	}
	if b, ok := e.buyer(t, 8); !ok || b.OrderID != id {
		t.Errorf("buyer record %+v %v, want kept", b, ok)
	}
	if got := e.remaining(t, item); got != 4 {
		t.Errorf("remaining %d, want 4", got)
	}
	assertOrder(t, e.pool, id, flashsale.OrderPending)
}

// A reconciler that stopped between its commit and the Redis release left an
// outbox row and the pending member: the next run finishes the job.
func TestReconcilerFinishesInterruptedReturn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5)
	ctx := context.Background()
	clk := newClock(t0)
	item := e.item(0)
	id := uuid.NewString()
	if err := e.st.Reserve(ctx, e.sale.ID, item.ID, 3, id, t0); err != nil {
		t.Fatal(err)
	}
	insertOrder(t, e, id, item.ID, 3, flashsale.OrderRejected)
	if _, err := e.pool.Exec(ctx, `INSERT INTO stock_returns (order_id, sale_id, item_id, user_id) VALUES ($1, $2, $3, 3)`, id, e.sale.ID, item.ID); err != nil {
		t.Fatal(err)
	}
	r := New(Config{Now: clk.now}, e.pool, e.st, e, nil, nil)
	clk.add(time.Hour)
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce = %d, %v; want 1", n, err)
	}
	if got := e.remaining(t, item); got != 5 {
		t.Errorf("remaining %d, want 5", got)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM stock_returns`); n != 0 {
		t.Errorf("%d outbox rows left, want 0", n)
	}
}

func TestReconcilersConcurrentReturnOnce(t *testing.T) {
	t.Parallel()
	const lost = 30
	e := newEnv(t, 50)
	ctx := context.Background()
	item := e.item(0)
	for u := int64(1); u <= lost; u++ {
		if err := e.st.Reserve(ctx, e.sale.ID, item.ID, u, uuid.NewString(), t0.Add(time.Duration(u)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	clk := newClock(t0.Add(time.Hour))
	var wg sync.WaitGroup
	results := make([]int, 3)
	errs := make([]error, 3)
	for i := range results {
		r := New(Config{Now: clk.now, Batch: 7}, e.pool, e.st, e, nil, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = r.RunOnce(ctx)
		}()
	}
	wg.Wait()
	total := 0
	for i := range results {
		if errs[i] != nil {
			t.Errorf("reconciler %d: %v", i, errs[i])
		}
		total += results[i]
	}
	if total != lost {
		t.Errorf("returned %d in total (%v), want %d", total, results, lost)
	}
	if got := e.remaining(t, item); got != 50 {
		t.Errorf("remaining %d, want 50", got)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM orders WHERE status = 'REJECTED'`); n != lost {
		t.Errorf("%d tombstones, want %d", n, lost)
	}
	if n := countRows(t, e.pool, `SELECT count(DISTINCT order_id) FROM order_events WHERE type = 'order.rejected'`); n != lost {
		t.Errorf("%d orders with an order.rejected event, want %d", n, lost)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM order_events`); n != lost {
		t.Errorf("%d events, want %d (one per tombstone, whichever reconciler won)", n, lost)
	}
	if n, _ := e.st.BuyerCount(ctx, e.sale.ID); n != 0 {
		t.Errorf("%d buyer records left, want 0", n)
	}
}

// Redis loses everything: the stock and buyer records come back from the
// database.
func TestReconcilerRebuildsAfterRedisLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 4)
	ctx := context.Background()
	a, b := e.item(0), e.item(1)
	live := map[int64]string{}
	for _, o := range []struct {
		user   int64
		item   int64
		status flashsale.OrderStatus
	}{
		{1, a.ID, flashsale.OrderPending},
		{2, a.ID, flashsale.OrderPaid},
		{3, b.ID, flashsale.OrderPending},
		{4, a.ID, flashsale.OrderExpired},
		{5, b.ID, flashsale.OrderRejected},
	} {
		id := uuid.NewString()
		insertOrder(t, e, id, o.item, o.user, o.status)
		if o.status.Live() {
			live[o.user] = id
		}
	}
	if err := testenv.Flush(ctx, e.rdb); err != nil {
		t.Fatal(err)
	}
	// The stock script answers NOT_FOUND until the rebuild.
	if err := e.st.Reserve(ctx, e.sale.ID, a.ID, 9, uuid.NewString(), t0); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Fatalf("Reserve with the stock lost: %v, want NOT_FOUND", err)
	}
	clk := newClock(t0)
	r := New(Config{Now: clk.now}, e.pool, e.st, e, nil, nil)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// Publishes in flight at the loss get their bound first.
	if got, _ := e.st.ItemsRemaining(ctx, e.sale.ID, []int64{a.ID}); got[0] != -1 {
		t.Fatalf("stock rebuilt before the publish bound: %d", got[0])
	}
	clk.add(redisstock.DefaultPublishTimeout)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.remaining(t, a); got != 8 {
		t.Errorf("item a remaining %d, want 8", got)
	}
	if got := e.remaining(t, b); got != 3 {
		t.Errorf("item b remaining %d, want 3", got)
	}
	for u, id := range live {
		if bu, ok := e.buyer(t, u); !ok || bu.OrderID != id {
			t.Errorf("user %d buyer record %+v %v, want order %s", u, bu, ok, id)
		}
	}
	for _, u := range []int64{4, 5} {
		if _, ok := e.buyer(t, u); ok {
			t.Errorf("user %d (no live order) has a buyer record", u)
		}
	}
	// Rebuilt records behave: a live buyer cannot buy again, its expiry
	// gives its unit back, a second run changes nothing.
	if err := e.st.Reserve(ctx, e.sale.ID, b.ID, 1, uuid.NewString(), t0); flashsale.ErrorCode(err) != flashsale.CodeAlreadyPurchased {
		t.Errorf("live buyer buys again: %v, want ALREADY_PURCHASED", err)
	}
	if ok, err := e.st.Release(ctx, e.sale.ID, 1, a.ID, live[1]); err != nil || !ok {
		t.Errorf("release of a rebuilt order = %v, %v; want true", ok, err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.remaining(t, a); got != 9 {
		t.Errorf("item a remaining after release and a second run %d, want 9", got)
	}
}

func TestReconcilerRunStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	r := New(Config{Interval: 10 * time.Millisecond}, e.pool, e.st, e, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil on cancellation", err)
	}
}

// Reservations left pending because Kafka holds their records do not hide
// the ones behind them: the reconciler pages past them and declares lost
// (after the writer handled it without a row) the newest one.
func TestReconcilerPagesPastHeldReservations(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	k := testenv.NewKafka(t)
	p := newProducer(t, k, 3*time.Second)
	ctx := context.Background()
	item := e.item(0)
	type res struct {
		id   string
		user int64
		at   time.Time
	}
	// The newest reservation's record is the first in the partition, the
	// only one the group has consumed.
	rs := []res{{uuid.NewString(), 1, t0.Add(5 * time.Second)}}
	for u := int64(2); u <= 5; u++ {
		rs = append(rs, res{uuid.NewString(), u, t0.Add(time.Duration(u-1) * time.Second)})
	}
	var part int32
	var places []redisstock.Placement
	for _, r := range rs {
		if err := e.st.Reserve(ctx, e.sale.ID, item.ID, r.user, r.id, r.at); err != nil {
			t.Fatal(err)
		}
		pt, off, err := p.PublishAt(ctx, flashsale.OrderPlaced{OrderID: r.id, SaleID: e.sale.ID, ItemID: item.ID, UserID: r.user, CreatedAtMs: r.at.UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		part = pt
		places = append(places, redisstock.Placement{SaleID: e.sale.ID, OrderID: r.id, Partition: pt, Offset: off})
	}
	if err := e.st.RecordPlaced(ctx, places); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: flashsale.TopicOrders, Partition: part, At: places[0].Offset + 1, LeaderEpoch: -1})
	if err := kadm.NewClient(cl).CommitAllOffsets(ctx, kafka.DefaultWriterGroup, offs); err != nil {
		t.Fatal(err)
	}
	orders, err := kafka.NewOrderLog(kafka.OrderLogConfig{Brokers: k.Brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer orders.Close()
	r := New(Config{Now: newClock(t0.Add(time.Hour)).now, Batch: 2, Orders: orders}, e.pool, e.st, e, nil, nil)
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce = %d, %v; want 1 (the consumed reservation without a row)", n, err)
	}
	assertOrder(t, e.pool, rs[0].id, flashsale.OrderRejected)
	if n := countRows(t, e.pool, `SELECT count(*) FROM orders`); n != 1 {
		t.Errorf("%d order rows, want only the one tombstone", n)
	}
	if n := e.pending(t); n != 4 {
		t.Errorf("%d pending, want the 4 held", n)
	}
	var m dto.Metric
	if err := r.stale.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetGauge().GetValue(); got != 4 {
		t.Errorf("stale-pending gauge %v, want the 4 held", got)
	}
}

// A live stock addition still in its outbox when Redis lost the stock is
// in items.quantity but not in Redis: the rebuild leaves it out, and the
// addition applied afterwards counts it once.
func TestReconcilerRebuildLeavesPendingStockAdds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 4)
	ctx := context.Background()
	a := e.item(0)
	if _, err := e.pool.Exec(ctx, `UPDATE items SET quantity = quantity + 5 WHERE id = $1`, a.ID); err != nil {
		t.Fatal(err)
	}
	var addID int64
	if err := e.pool.QueryRow(ctx, `INSERT INTO stock_adds (sale_id, item_id, units) VALUES ($1, $2, 5) RETURNING id`, e.sale.ID, a.ID).Scan(&addID); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Flush(ctx, e.rdb); err != nil {
		t.Fatal(err)
	}
	if err := e.st.AddStock(ctx, e.sale.ID, addID, a.ID, 5); err == nil {
		t.Fatal("an addition onto a lost stock record succeeded")
	}
	clk := newClock(t0)
	r := New(Config{Now: clk.now}, e.pool, e.st, e, nil, nil)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	clk.add(redisstock.DefaultPublishTimeout)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.remaining(t, a); got != 10 {
		t.Fatalf("rebuilt remaining %d, want 10 (quantity 15 less the 5 pending)", got)
	}
	for range 2 {
		if err := e.st.AddStock(ctx, e.sale.ID, addID, a.ID, 5); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.remaining(t, a); got != 15 {
		t.Fatalf("remaining after the pending addition %d, want 15", got)
	}
}

// The broker dies while the producer holds a connection: the request may
// have been written, so nobody knows whether the order will land. Reserve
// still answers within the bound; the reservation is left to the
// reconciler, which returns it once it is older than its bound.
func TestReservePublishUncertainLeftToReconciler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5)
	k := testenv.NewKafka(t)
	const bound = time.Second
	p := newProducer(t, k, bound)
	clk := newClock(t0)
	s := purchase.New(purchase.Config{Now: clk.now, PublishTimeout: bound}, e.st, p, nil, nil)
	item := e.item(0)
	if _, err := s.Reserve(context.Background(), e.sale, item, 1); err != nil {
		t.Fatalf("Reserve with Kafka up: %v", err)
	}
	k.Cluster.Close()
	_, err := reserveBounded(t, s, e, item, 2, bound)
	var fe *flashsale.Error
	if !errors.As(err, &fe) || fe.Code != flashsale.CodeUnavailable {
		t.Fatalf("Reserve with Kafka gone: %v, want UNAVAILABLE", err)
	}
	if !kafka.IsUncertain(err) {
		// The producer found out nothing was sent: given back at once.
		if r := e.remaining(t, item); r != 4 {
			t.Errorf("definite failure: remaining %d, want 4", r)
		}
		t.Skip("the producer could tell that nothing was sent; the uncertain path did not happen")
	}
	if fe.OrderID == "" {
		t.Error("uncertain UNAVAILABLE without the order id")
	}
	if b, ok := e.buyer(t, 2); !ok || b.OrderID != fe.OrderID {
		t.Fatalf("buyer record %+v %v, want the uncertain order %s held", b, ok, fe.OrderID)
	}
	// User 1's order reached Kafka; here the writer never runs, so it is
	// pending too. Store it the way the writer would before the bound.
	insertOrder(t, e, orderOf(t, e, 1), item.ID, 1, flashsale.OrderPending)
	r := New(Config{Now: clk.now}, e.pool, e.st, e, nil, nil)
	clk.add(DefaultAfter + time.Second)
	n, err := r.RunOnce(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("RunOnce = %d, %v; want 1 returned", n, err)
	}
	if got := e.remaining(t, item); got != 4 {
		t.Errorf("remaining %d, want 4 (user 1 holds one)", got)
	}
	if _, ok := e.buyer(t, 2); ok {
		t.Error("uncertain reservation still held after the reconciler")
	}
	assertOrder(t, e.pool, fe.OrderID, flashsale.OrderRejected)
}
