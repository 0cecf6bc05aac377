package writer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
	"github.com/flashsale/flashsale/purchase"
	"github.com/flashsale/flashsale/reconcile"
	"github.com/flashsale/flashsale/sales"
	"github.com/flashsale/flashsale/sales/salestest"
)

func TestMain(m *testing.M) {
	if os.Getenv(writerHelperEnv) != "" {
		os.Exit(runWriterHelper())
	}
	testenv.Main(m)
}

// env is one test's world: its own database, Redis database and Kafka.
type env struct {
	pool  *pgxpool.Pool
	rdb   redis.UniversalClient
	stock *redisstock.Store
	sales *sales.Store
	kafka *testenv.Kafka
	prod  *kgo.Client
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{pool: testenv.Postgres(t), rdb: testenv.Redis(t), kafka: testenv.NewKafka(t)}
	e.stock = redisstock.New(e.rdb)
	e.sales = sales.NewStore(e.pool, e.rdb, e.stock, nil)
	prod, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	e.prod = prod
	return e
}

func (e *env) newSale(t testing.TB, quantities ...int64) flashsale.Sale {
	t.Helper()
	return salestest.Create(t, e.sales, time.Now().Add(-time.Minute), 1999, quantities...)
}

// reserve takes a unit in Redis as the purchase service would and returns
// the message it would publish.
func (e *env) reserve(t testing.TB, item flashsale.Item, userID int64) flashsale.OrderPlaced {
	t.Helper()
	now := time.Now()
	m := flashsale.OrderPlaced{OrderID: uuid.NewString(), SaleID: item.SaleID, ItemID: item.ID, UserID: userID,
		PriceCents: item.PriceCents, CreatedAtMs: now.UnixMilli()}
	if err := e.stock.Reserve(context.Background(), item.SaleID, item.ID, userID, m.OrderID, now); err != nil {
		t.Fatalf("reserve user %d: %v", userID, err)
	}
	return m
}

func (e *env) publish(t testing.TB, msgs ...flashsale.OrderPlaced) {
	t.Helper()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = &kgo.Record{Topic: flashsale.TopicOrders, Key: []byte(strconv.FormatInt(m.ItemID, 10)), Value: b}
	}
	e.produce(t, recs...)
}

func (e *env) produce(t testing.TB, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// running is a writer started by a test.
type running struct {
	w      *Writer
	cancel context.CancelFunc
	done   chan error
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

func (e *env) start(t testing.TB, cfg Config) *running {
	t.Helper()
	cfg.Brokers = e.kafka.Brokers
	w, err := New(cfg, e.pool, e.stock, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() {
		r.stop(t)
		w.Close()
	})
	return r
}

// stop cancels Run and returns its error (nil when already returned).
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("writer did not stop")
		return nil
	}
}

// wait returns Run's error once it returned on its own.
func (r *running) wait(t testing.TB) error {
	t.Helper()
	select {
	case err := <-r.done:
		close(r.done)
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("writer did not return")
		return nil
	}
}

// value reads a counter.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// histogramCount is the number of observations of h.
func histogramCount(t testing.TB, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// handled is the number of records the writer finished (offsets committed).
func (w *Writer) handled() int {
	return int(value(w.m.written) + value(w.m.duplicate) +
		value(w.m.rejected) + value(w.m.undecodable))
}

type counts struct{ written, duplicate, rejected, undecodable int }

func (w *Writer) counts() counts {
	return counts{int(value(w.m.written)), int(value(w.m.duplicate)),
		int(value(w.m.rejected)), int(value(w.m.undecodable))}
}

// waitHandled waits until the writer finished n records.
func waitHandled(t testing.TB, w *Writer, n int) {
	t.Helper()
	waitForf(t, func() string {
		return fmt.Sprintf("the writer to handle %d records (handled %d: %+v)", n, w.handled(), w.counts())
	}, func() bool { return w.handled() >= n })
}

// waitFor polls cond for up to 30 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitForf(t, func() string { return what }, cond)
}

// waitForf is waitFor with the description built when it times out.
func waitForf(t testing.TB, what func() string, cond func() bool) {
	t.Helper()
	testenv.EventuallyF(t, what, 30*time.Second, cond)
}

type orderRow struct {
	status, reason string
	userID         int64
	created        time.Time
	expires        time.Time
}

func orderRows(t testing.TB, pool *pgxpool.Pool, saleID int64) map[string]orderRow {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT id::text, status, coalesce(reject_reason, ''), user_id, created_at, expires_at FROM orders WHERE sale_id = $1`, saleID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]orderRow{}
	for rows.Next() {
		var id string
		var r orderRow
		if err := rows.Scan(&id, &r.status, &r.reason, &r.userID, &r.created, &r.expires); err != nil {
			t.Fatal(err)
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sold(t testing.TB, pool *pgxpool.Pool, itemID int64) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT sold FROM items WHERE id = $1`, itemID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func countRows(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func pendingCount(t testing.TB, rdb redis.UniversalClient, saleID int64) int64 {
	t.Helper()
	return intResult(t, rdb.ZCard(context.Background(), lua.PendingKey(saleID)))
}

// intResult is the count a Redis command answered, failing the test on
// an error.
func intResult(t testing.TB, cmd *redis.IntCmd) int64 {
	t.Helper()
	n, err := cmd.Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// rebuildPastPublishTimeout checks that user's purchase is refused while
// the stock record is missing, then runs the reconciler with every
// publish past its timeout, so that it rebuilds the record.
func rebuildPastPublishTimeout(t testing.TB, svc *purchase.Service, sale *flashsale.Sale, item flashsale.Item, user int64, clk *offsetClock, rec *reconcile.Reconciler) {
	t.Helper()
	ctx := context.Background()
	if _, err := svc.Reserve(ctx, sale, item, user); flashsale.ErrorCode(err) != flashsale.CodeUnavailable {
		t.Fatalf("purchase before the rebuild: %v, want UNAVAILABLE", err)
	}
	clk.ahead = purchase.DefaultPublishTimeout
	if _, err := rec.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
}

// sellRestAndSettle sells the last 4 of the sale's 10 units to users 7…10
// and checks an 11th purchase is sold out; then it starts a writer and
// checks every acknowledged order reaches the database as PENDING and
// none is REJECTED.
func sellRestAndSettle(t testing.TB, e *env, svc *purchase.Service, sale *flashsale.Sale, item flashsale.Item, acked map[string]bool) {
	t.Helper()
	for u := int64(7); u <= 10; u++ {
		acked[buy(t, svc, sale, item, u)] = true
	}
	if _, err := svc.Reserve(context.Background(), sale, item, 11); flashsale.ErrorCode(err) != flashsale.CodeSoldOut {
		t.Errorf("purchase past the stock: %v, want SOLD_OUT", err)
	}
	e.start(t, Config{})
	waitFor(t, "every acknowledged order in the database", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM orders WHERE sale_id = $1`, sale.ID) >= len(acked)
	})
	rows := orderRows(t, e.pool, sale.ID)
	for id := range acked {
		if rows[id].status != string(flashsale.OrderPending) {
			t.Errorf("acknowledged order %s is %q (%s), want PENDING", id, rows[id].status, rows[id].reason)
		}
	}
	if n := statusCount(t, e.pool, sale.ID, string(flashsale.OrderRejected)); n != 0 {
		t.Errorf("%d orders REJECTED, want 0", n)
	}
}

// deadLetters reads n records of the dead-letter topic.
func deadLetters(t testing.TB, brokers []string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(flashsale.TopicDeadLetter),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("dead-letter topic: got %d records, want %d", len(out), n)
		}
		out = append(out, fs.Records()...)
	}
	// Nothing more than n.
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if extra := cl.PollFetches(short).Records(); len(extra) > 0 {
		t.Fatalf("dead-letter topic: %d more records than the %d expected", len(extra), n)
	}
	return out
}

// adminClient is an admin client of brokers and a context of 10 s for
// its requests; done cancels the context and closes the client.
func adminClient(t testing.TB, brokers []string) (ctx context.Context, adm *kadm.Client, done func()) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	return ctx, kadm.NewClient(cl), func() { cancel(); cl.Close() }
}

// committed is the sum of the group's committed offsets on the orders topic.
func committed(t testing.TB, brokers []string, group string) int64 {
	t.Helper()
	ctx, adm, done := adminClient(t, brokers)
	defer done()
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == flashsale.TopicOrders && o.Err == nil {
			sum += o.At
		}
	})
	return sum
}

var errTestKill = errors.New("test: writer killed after the database commit")

// orderEvent is one outbox row of an order (migration 0006).
type orderEvent struct {
	id      int64
	typ     string
	status  string
	reason  string
	eventID int64
	userID  string
	at      time.Time
}

// orderEvents returns the outbox rows of orderID in id order, with the
// fields of their bodies the tests check.
func orderEvents(t testing.TB, pool *pgxpool.Pool, orderID string) []orderEvent {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, type, body->>'status', coalesce(body->>'reason', ''),
		(body->>'eventId')::int8, body->>'userId', (body->>'occurredAt')::timestamptz
		FROM order_events WHERE order_id = $1 ORDER BY id`, orderID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (orderEvent, error) {
		var e orderEvent
		err := r.Scan(&e.id, &e.typ, &e.status, &e.reason, &e.eventID, &e.userID, &e.at)
		return e, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// wantEvents checks that orderID has exactly the events of types, in order.
func wantEvents(t testing.TB, pool *pgxpool.Pool, orderID string, types ...string) []orderEvent {
	t.Helper()
	evs := orderEvents(t, pool, orderID)
	var got []string
	for _, e := range evs {
		got = append(got, e.typ)
		if e.eventID != e.id {
			t.Errorf("order %s: event %d carries eventId %d", orderID, e.id, e.eventID)
		}
	}
	if !slices.Equal(got, types) {
		t.Errorf("order %s: events %v, want %v", orderID, got, types)
	}
	return evs
}
