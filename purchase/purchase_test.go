package purchase

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/sales"
	"github.com/flashsale/flashsale/sales/salestest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var t0 = time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)

// clock is an injected, settable clock.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock    { c := &clock{}; c.set(t); return c }
func (c *clock) set(t time.Time)     { c.ns.Store(t.UnixNano()) }
func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

// env is one test's Redis, PostgreSQL and a sale stored in both.
type env struct {
	rdb  redis.UniversalClient
	pool *pgxpool.Pool
	st   *redisstock.Store
	sale *flashsale.Sale
}

func (e *env) Sales() []*flashsale.Sale { return []*flashsale.Sale{e.sale} }

func newEnv(t testing.TB, quantities ...int64) *env {
	t.Helper()
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	st := redisstock.New(rdb)
	ctx := context.Background()
	if err := st.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	sl := salestest.Create(t, sales.NewStore(pool, rdb, st, nil), t0, 1999, quantities...)
	return &env{rdb: rdb, pool: pool, st: st, sale: &sl}
}

func (e *env) item(i int) flashsale.Item { return e.sale.Items[i] }

func (e *env) remaining(t testing.TB, item flashsale.Item) int64 {
	t.Helper()
	m, err := e.st.Remaining(context.Background(), e.sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	return m[item.ID]
}

func (e *env) pending(t testing.TB) int {
	t.Helper()
	p, err := e.st.PendingBefore(context.Background(), e.sale.ID, t0.Add(100*time.Hour), 0)
	if err != nil {
		t.Fatal(err)
	}
	return len(p)
}

func (e *env) buyer(t testing.TB, user int64) (redisstock.Buyer, bool) {
	t.Helper()
	b, ok, err := e.st.Buyer(context.Background(), e.sale.ID, user)
	if err != nil {
		t.Fatal(err)
	}
	return b, ok
}

// pubFunc is a Publisher made of a function.
type pubFunc func(ctx context.Context, o flashsale.OrderPlaced) error

func (f pubFunc) Publish(ctx context.Context, o flashsale.OrderPlaced) error { return f(ctx, o) }

// recorder publishes into a slice.
type recorder struct {
	mu  sync.Mutex
	got []flashsale.OrderPlaced
}

func (r *recorder) Publish(_ context.Context, o flashsale.OrderPlaced) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, o)
	return nil
}

func newProducer(t testing.TB, k *testenv.Kafka, timeout time.Duration) *kafka.Producer {
	t.Helper()
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: k.Brokers, PublishTimeout: timeout, CloseTimeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// topicRecords counts the records ever written to topic.
func topicRecords(t *testing.T, k *testenv.Kafka, topic string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func codeOf(err error) flashsale.Code { return flashsale.ErrorCode(err) }

// reserveBounded runs Reserve and fails if it hangs far past bound.
func reserveBounded(t *testing.T, s *Service, e *env, item flashsale.Item, user int64, bound time.Duration) (string, error) {
	t.Helper()
	type res struct {
		id  string
		err error
	}
	done := make(chan res, 1)
	go func() {
		id, err := s.Reserve(context.Background(), e.sale, item, user)
		done <- res{id, err}
	}()
	select {
	case r := <-done:
		return r.id, r.err
	case <-time.After(bound + 10*time.Second):
		t.Fatalf("Reserve still blocked long after the publish bound %v", bound)
		return "", nil
	}
}

func TestReservePublishesOneOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	k := testenv.NewKafka(t)
	clk := newClock(t0)
	reg := prometheus.NewRegistry()
	s := New(Config{Now: clk.now}, e.st, newProducer(t, k, 3*time.Second), nil, reg)
	item := e.item(0)
	id, err := s.Reserve(context.Background(), e.sale, item, 42)
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	if got := topicRecords(t, k, flashsale.TopicOrders); got != 1 {
		t.Fatalf("%d records on %s, want exactly 1", got, flashsale.TopicOrders)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumeTopics(flashsale.TopicOrders),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) == 0 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	if len(recs) != 1 {
		t.Fatalf("consumed %d records, want 1", len(recs))
	}
	var got flashsale.OrderPlaced
	if err := json.Unmarshal(recs[0].Value, &got); err != nil {
		t.Fatal(err)
	}
	want := flashsale.OrderPlaced{OrderID: id, SaleID: e.sale.ID, ItemID: item.ID, UserID: 42, PriceCents: 1999, CreatedAtMs: t0.UnixMilli()}
	if got != want {
		t.Errorf("published %+v, want %+v", got, want)
	}
	if b, ok := e.buyer(t, 42); !ok || b.OrderID != id {
		t.Errorf("buyer record %+v %v, want order %s", b, ok, id)
	}
	if r := e.remaining(t, item); r != 9 {
		t.Errorf("remaining %d, want 9", r)
	}
	// The same user again, same item or not: ALREADY_PURCHASED, no publish.
	_, err = s.Reserve(context.Background(), e.sale, item, 42)
	var fe *flashsale.Error
	if !errors.As(err, &fe) || fe.Code != flashsale.CodeAlreadyPurchased || fe.OrderID != id {
		t.Fatalf("second Reserve: %v, want ALREADY_PURCHASED with order %s", err, id)
	}
	if got := topicRecords(t, k, flashsale.TopicOrders); got != 1 {
		t.Errorf("%d records after the refused retry, want 1", got)
	}
	if v := counterValue(t, s.outcomes[OutcomeReserved]); v != 1 {
		t.Errorf("reserved counter %v, want 1", v)
	}
	if v := counterValue(t, s.outcomes[OutcomeAlreadyPurchased]); v != 1 {
		t.Errorf("already_purchased counter %v, want 1", v)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		found = found || mf.GetName() == "flashsale_purchase_reservations_total"
	}
	if !found {
		t.Error("flashsale_purchase_reservations_total not registered")
	}
}

// The broker is gone before the producer ever reached it: the producer
// knows nothing was sent, so the unit goes back at once.
func TestReservePublishFailureGivesBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5)
	k := testenv.NewKafka(t)
	const bound = time.Second
	p := newProducer(t, k, bound)
	k.Cluster.Close()
	s := New(Config{Now: newClock(t0).now, PublishTimeout: bound}, e.st, p, nil, nil)
	item := e.item(0)
	_, err := reserveBounded(t, s, e, item, 7, bound)
	if codeOf(err) != flashsale.CodeUnavailable {
		t.Fatalf("Reserve with Kafka down: %v, want UNAVAILABLE", err)
	}
	if r := e.remaining(t, item); r != 5 {
		t.Errorf("remaining %d, want 5 (given back)", r)
	}
	if _, ok := e.buyer(t, 7); ok {
		t.Error("buyer record left after a failed publish")
	}
	if n := e.pending(t); n != 0 {
		t.Errorf("%d pending reservations left, want 0", n)
	}
	if v := counterValue(t, s.outcomes[OutcomePublishFailed]); v != 1 {
		t.Errorf("publish_failed counter %v, want 1", v)
	}
}

func TestReserveDefiniteFailureFake(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	var calls atomic.Int64
	fail := pubFunc(func(ctx context.Context, o flashsale.OrderPlaced) error {
		calls.Add(1)
		if _, ok := ctx.Deadline(); !ok {
			t.Error("Publish called without a deadline")
		}
		return errors.New("broker said no")
	})
	s := New(Config{}, e.st, fail, nil, nil)
	item := e.item(0)
	_, err := s.Reserve(context.Background(), e.sale, item, 9)
	if codeOf(err) != flashsale.CodeUnavailable {
		t.Fatalf("err %v, want UNAVAILABLE", err)
	}
	if flashsale.ErrorMessage(err) == "" || calls.Load() != 1 {
		t.Errorf("message %q, %d publishes; want a message and 1 publish", flashsale.ErrorMessage(err), calls.Load())
	}
	if r := e.remaining(t, item); r != 3 {
		t.Errorf("remaining %d, want 3", r)
	}
	if _, ok := e.buyer(t, 9); ok {
		t.Error("buyer record left")
	}
	// The user may try again and succeed once Kafka is back.
	s.pub = &recorder{}
	if _, err := s.Reserve(context.Background(), e.sale, item, 9); err != nil {
		t.Errorf("retry after the failure: %v", err)
	}
}

// A caller giving up mid-publish does not cut the publish short.
func TestReserveCallerCancelDoesNotAbandon(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	pub := pubFunc(func(pctx context.Context, o flashsale.OrderPlaced) error {
		cancel() // the shopper's connection drops now
		if err := pctx.Err(); err != nil {
			return err
		}
		return nil
	})
	s := New(Config{}, e.st, pub, nil, nil)
	id, err := s.Reserve(ctx, e.sale, e.item(0), 5)
	if err != nil || id == "" {
		t.Fatalf("Reserve = %q, %v; want the order", id, err)
	}
}

func TestReserveRedisDown(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	rec := &recorder{}
	s := New(Config{RedisTimeout: time.Second}, redisstock.New(rdb), rec, nil, nil)
	sale := &flashsale.Sale{ID: 1, Items: []flashsale.Item{{ID: 1001, SaleID: 1, Quantity: 1}}}
	_, err := s.Reserve(context.Background(), sale, sale.Items[0], 1)
	if codeOf(err) != flashsale.CodeUnavailable {
		t.Fatalf("err %v, want UNAVAILABLE", err)
	}
	if len(rec.got) != 0 {
		t.Errorf("published %d orders with Redis down, want 0", len(rec.got))
	}
	if s.SoldOut(1001) {
		t.Error("a Redis error flagged the item sold out")
	}
}

// Not parallel: it counts the commands of the whole redis-server.
func TestSoldOutFlag(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	s := New(Config{SoldOutRecheck: 20 * time.Millisecond}, e.st, &recorder{}, nil, nil)
	item := e.item(0)
	first, err := s.Reserve(ctx, e.sale, item, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s.SoldOut(item.ID) {
		t.Fatal("flagged before Redis said SOLD_OUT")
	}
	if _, err := s.Reserve(ctx, e.sale, item, 2); codeOf(err) != flashsale.CodeSoldOut {
		t.Fatalf("second shopper: %v, want SOLD_OUT", err)
	}
	if !s.SoldOut(item.ID) {
		t.Fatal("not flagged after Redis said SOLD_OUT")
	}
	// Two consecutive readings cost one INFO; a flagged Reserve in
	// between must cost nothing more.
	idle := commandsDelta(t, e, func() {})
	busy := commandsDelta(t, e, func() {
		for u := int64(3); u < 13; u++ {
			if _, err := s.Reserve(ctx, e.sale, item, u); codeOf(err) != flashsale.CodeSoldOut {
				t.Errorf("flagged Reserve: %v, want SOLD_OUT", err)
			}
		}
	})
	if busy != idle {
		t.Errorf("10 flagged Reserves cost %d Redis commands, want 0", busy-idle)
	}
	if v := counterValue(t, s.outcomes[OutcomeSoldOutFlag]); v != 10 {
		t.Errorf("sold_out_flag counter %v, want 10", v)
	}

	// Stock comes back (the first order expired): the flag clears.
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.Run(runCtx) }()
	defer func() { stop(); wg.Wait() }()
	if ok, err := e.st.Release(ctx, e.sale.ID, 1, item.ID, first); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	testenv.Eventually(t, "the sold-out flag to clear after stock came back", 10*time.Second, func() bool { return !s.SoldOut(item.ID) })
	if _, err := s.Reserve(ctx, e.sale, item, 3); err != nil {
		t.Errorf("after the flag cleared: %v, want a reservation", err)
	}
}

func commandsDelta(t *testing.T, e *env, f func()) int64 {
	t.Helper()
	ctx := context.Background()
	a, err := redisconn.Commands(ctx, e.rdb)
	if err != nil {
		t.Fatal(err)
	}
	f()
	b, err := redisconn.Commands(ctx, e.rdb)
	if err != nil {
		t.Fatal(err)
	}
	return b - a
}

func TestSoldOutFlagStaysWhileStockRecordMissing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	s := New(Config{}, e.st, &recorder{}, nil, nil)
	item := e.item(0)
	s.setSoldOut(e.sale.ID, item.ID)
	if err := testenv.Flush(ctx, e.rdb); err != nil {
		t.Fatal(err)
	}
	if err := s.recheckSoldOut(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.SoldOut(item.ID) {
		t.Error("flag cleared for an item Redis has no record of")
	}
	if err := e.st.Load(ctx, e.sale.ID, map[int64]int64{item.ID: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.recheckSoldOut(ctx); err != nil {
		t.Fatal(err)
	}
	if s.SoldOut(item.ID) {
		t.Error("flag kept after stock came back")
	}
}

// BenchmarkServiceReserveInStock is Service.Reserve end to end with a kfake
// publish acknowledged by the broker, every call a fresh shopper who gets a
// unit.
func BenchmarkServiceReserveInStock(b *testing.B) {
	opt, err := redis.ParseURL(testenv.RedisURL(b))
	if err != nil {
		b.Fatal(err)
	}
	opt.PoolSize = 64
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	st := redisstock.New(rdb)
	ctx := context.Background()
	if err := st.LoadScripts(ctx); err != nil {
		b.Fatal(err)
	}
	sale := &flashsale.Sale{ID: 1, Items: []flashsale.Item{{ID: 1001, SaleID: 1, Quantity: 1 << 40, PriceCents: 1999}}}
	if err := st.Load(ctx, 1, map[int64]int64{1001: 1 << 40}); err != nil {
		b.Fatal(err)
	}
	k := testenv.NewKafka(b)
	s := New(Config{}, st, newProducer(b, k, 3*time.Second), nil, nil)
	var user atomic.Int64
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Reserve(ctx, sale, sale.Items[0], user.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// Redis lost the sale's stock record (data loss, not yet rebuilt): a
// purchase is answered UNAVAILABLE with nothing reserved, never SOLD_OUT,
// and the local sold-out flag stays clear.
func TestReserveWithStockRecordLostIsUnavailable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	ctx := context.Background()
	rec := &recorder{}
	s := New(Config{}, e.st, rec, nil, nil)
	item := e.item(0)
	if err := testenv.Flush(ctx, e.rdb); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := s.Reserve(ctx, e.sale, item, 5)
		if got := codeOf(err); got != flashsale.CodeUnavailable {
			t.Fatalf("Reserve with the stock record lost: %v, want UNAVAILABLE", err)
		}
	}
	if s.SoldOut(item.ID) {
		t.Error("sold-out flag set by a lost stock record")
	}
	if _, ok := e.buyer(t, 5); ok {
		t.Error("a buyer record was written")
	}
	if n := len(rec.got); n != 0 {
		t.Errorf("%d orders published, want 0", n)
	}
}

// boundedFunc is a Publisher that bounds itself, as *kafka.Producer does.
type boundedFunc struct {
	pubFunc
	bound time.Duration
}

func (b boundedFunc) Bound() time.Duration { return b.bound }

// A publisher that bounds every publish by itself within the Service's
// bound gets no deadline of the Service's (one timer per publish, its
// own); one whose bound is longer gets the Service's.
func TestBoundedPublisherGetsNoDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	for i, tc := range []struct {
		bound        time.Duration
		wantDeadline bool
	}{{DefaultPublishTimeout, false}, {DefaultPublishTimeout + time.Second, true}} {
		var got bool
		pub := boundedFunc{bound: tc.bound, pubFunc: func(ctx context.Context, _ flashsale.OrderPlaced) error {
			_, got = ctx.Deadline()
			return nil
		}}
		s := New(Config{}, e.st, pub, nil, nil)
		if _, err := s.Reserve(context.Background(), e.sale, e.item(0), int64(20+i)); err != nil {
			t.Fatal(err)
		}
		if got != tc.wantDeadline {
			t.Errorf("publisher bound %v: deadline %v, want %v", tc.bound, got, tc.wantDeadline)
		}
	}
}
