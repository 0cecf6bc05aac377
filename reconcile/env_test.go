package reconcile

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/purchase"
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

// env is one test's Redis, PostgreSQL and a sale stored in both; it is
// the reconciler's SaleLister.
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
	if err := st.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	sl := salestest.Create(t, sales.NewStore(pool, rdb, st, nil), t0, 1999, quantities...)
	return &env{rdb: rdb, pool: pool, st: st, sale: &sl}
}

// newShardedEnv is newEnv with the sale's stock split over shards.
func newShardedEnv(t testing.TB, shards int, quantities ...int64) *env {
	t.Helper()
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	st := redisstock.New(rdb)
	sl := salestest.CreateSharded(t, sales.NewStore(pool, rdb, st, nil), t0, 1999, shards, quantities...)
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

// usersHomedOn returns n users whose records live on the given shard.
func (e *env) usersHomedOn(n, shard int) []int64 {
	var out []int64
	for u := int64(1); len(out) < n; u++ {
		if e.st.HomeShard(e.sale.ID, u) == shard {
			out = append(out, u)
		}
	}
	return out
}

func (e *env) shardUnits(t testing.TB, shard int, item int64) int64 {
	t.Helper()
	m, err := e.st.ShardRemaining(context.Background(), e.sale.ID, shard)
	if err != nil {
		t.Fatal(err)
	}
	return m[item]
}

func orderOf(t *testing.T, e *env, user int64) string {
	t.Helper()
	b, ok := e.buyer(t, user)
	if !ok {
		t.Fatalf("user %d holds nothing", user)
	}
	return b.OrderID
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

func newOrderLog(t testing.TB, k *testenv.Kafka) *kafka.OrderLog {
	t.Helper()
	orders, err := kafka.NewOrderLog(kafka.OrderLogConfig{Brokers: k.Brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(orders.Close)
	return orders
}

// reserveBounded runs the purchase service's Reserve and fails if it hangs
// far past bound.
func reserveBounded(t *testing.T, s *purchase.Service, e *env, item flashsale.Item, user int64, bound time.Duration) (string, error) {
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
