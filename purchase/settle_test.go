package purchase

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/sales"
	"github.com/flashsale/flashsale/sales/salestest"
)

// frozenEnv is a sale on a redis-server of the test's own (to freeze), a
// Service publishing to kfake, and its Run.
type frozenEnv struct {
	*env
	srv   *localsvc.Redis
	k     *testenv.Kafka
	s     *Service
	reg   *prometheus.Registry
	lease *Leaser // nil: none
}

func newFrozenEnv(t *testing.T, quantity int64) *frozenEnv {
	t.Helper()
	return newFrozenEnvLeased(t, quantity, 0)
}

// newFrozenEnvLeased is newFrozenEnv with a placement Leaser of lease TTL
// ttl running beside the Service (none when ttl is 0).
func newFrozenEnvLeased(t *testing.T, quantity int64, ttl time.Duration) *frozenEnv {
	t.Helper()
	srv := testenv.NewRedisServer(t)
	// Never leave it stopped: its own cleanup (registered first) runs
	// after this one.
	t.Cleanup(func() { _ = srv.Signal(syscall.SIGCONT) })
	// Connections opened before the freeze (four blocking reads at once):
	// a command on one is sent at once and runs when Redis wakes. A
	// connection opened during the freeze never sends it (its handshake
	// times out first): a reservation that never ran, the other outcome.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _ = rdb.Do(context.Background(), "BLPOP", "warm", "0.1").Err() })
	}
	wg.Wait()
	if n := rdb.PoolStats().IdleConns; n < 4 {
		t.Fatalf("%d idle connections, want 4", n)
	}
	pool := testenv.Postgres(t)
	st := redisstock.New(rdb)
	if err := st.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	sl := salestest.Create(t, sales.NewStore(pool, rdb, st, nil), t0, 1999, quantity)
	k := testenv.NewKafka(t)
	reg := prometheus.NewRegistry()
	var leaser *Leaser
	if ttl > 0 {
		leaser = NewLeaser(st, ttl, nil, nil)
		lctx, lstop := context.WithCancel(context.Background())
		ldone := make(chan struct{})
		go func() { _ = leaser.Run(lctx); close(ldone) }()
		t.Cleanup(func() { lstop(); <-ldone })
		testenv.Eventually(t, "a lease", 10*time.Second, func() bool { return leaser.Slot() > 0 })
	}
	s := New(Config{Now: newClock(t0).now, RedisTimeout: time.Second, Lease: leaser}, st, newProducer(t, k, 3*time.Second), nil, reg)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	return &frozenEnv{env: &env{rdb: rdb, pool: pool, st: st, sale: &sl}, srv: srv, k: k, s: s, reg: reg, lease: leaser}
}

// freeze stops the redis-server (SIGSTOP); thaw lets it go on (SIGCONT).
func (f *frozenEnv) freeze(t *testing.T) { t.Helper(); f.signal(t, syscall.SIGSTOP) }
func (f *frozenEnv) thaw(t *testing.T)   { t.Helper(); f.signal(t, syscall.SIGCONT) }

func (f *frozenEnv) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := f.srv.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// uncertainID reserves for user while Redis is frozen: 503 UNAVAILABLE
// naming the order.
func (f *frozenEnv) uncertainID(t *testing.T, user int64) string {
	t.Helper()
	id, err := f.s.Reserve(context.Background(), f.sale, f.item(0), user)
	var fe *flashsale.Error
	if id != "" || !errors.As(err, &fe) || fe.Code != flashsale.CodeUnavailable || fe.OrderID == "" {
		t.Fatalf("Reserve with Redis frozen = %q, %v; want UNAVAILABLE naming the order", id, err)
	}
	return fe.OrderID
}

// A reservation cut short by a frozen redis-server (SIGSTOP) is uncertain:
// 503 with its order's id. Its command runs when Redis wakes, and the
// gateway settles it then: the order is published (not left for the
// Reconciler to reject), and the shopper's retry is answered 202 with the
// same order, never ALREADY_PURCHASED.
func TestReserveFrozenRedisSettles(t *testing.T) {
	f := newFrozenEnv(t, 5)
	f.freeze(t)
	id7, id8 := f.uncertainID(t, 7), f.uncertainID(t, 8)
	if n := f.s.Unsettled(); n != 2 {
		t.Fatalf("%d unsettled, want 2", n)
	}
	f.thaw(t)
	// User 8 retries at once: Redis names the order; it is settled now.
	if id, err := f.s.Reserve(context.Background(), f.sale, f.item(0), 8); err != nil || id != id8 {
		t.Fatalf("retry after the freeze = %q, %v; want 202 with %s", id, err, id8)
	}
	// User 7 never retries: Run settles the order within the bound. An
	// order leaves the set when its settling starts, and is published
	// after: the records are counted once both are on the topic.
	testenv.Eventually(t, "the uncertain reservation settled", 5*time.Second, func() bool { return f.s.Unsettled() == 0 })
	testenv.Eventually(t, "one record per uncertain reservation that ran", 10*time.Second, func() bool {
		return topicRecords(t, f.k, flashsale.TopicOrders) == 2
	})
	for u, id := range map[int64]string{7: id7, 8: id8} {
		if b, ok := f.buyer(t, u); !ok || b.OrderID != id {
			t.Errorf("user %d: buyer record %+v %v, want order %s kept", u, b, ok, id)
		}
	}
	if r := f.remaining(t, f.item(0)); r != 3 {
		t.Errorf("remaining %d, want 3", r)
	}
	if v := counterValue(t, f.s.outcomes[OutcomeReserveUncertain]); v != 2 {
		t.Errorf("%s = %v, want 2", OutcomeReserveUncertain, v)
	}
	if v := counterValue(t, f.s.outcomes[OutcomeAlreadyPurchased]); v != 0 {
		t.Errorf("%s = %v, want 0: the retry was answered with its order", OutcomeAlreadyPurchased, v)
	}
}

// A reservation made under no lease (the gateway's ran out while Redis
// was frozen) and seen in Redis when it wakes is acknowledged to the
// retry: its span counts from when Redis showed it, not from its making,
// so a freeze longer than the lease's span answers 202 as before leases.
func TestReserveFrozenPastTheLeaseSpanSettles(t *testing.T) {
	const ttl = 600 * time.Millisecond
	f := newFrozenEnvLeased(t, 5, ttl)
	f.freeze(t)
	testenv.Eventually(t, "the lease no longer valid here", 10*time.Second, func() bool { return f.lease.Slot() == 0 })
	id8 := f.uncertainID(t, 8) // a second: past the lease's span of its making
	f.thaw(t)
	if id, err := f.s.Reserve(context.Background(), f.sale, f.item(0), 8); err != nil || id != id8 {
		t.Fatalf("retry after the freeze = %q, %v; want 202 with %s", id, err, id8)
	}
}

// A reservation made under no lease that waited in a frozen Redis's socket
// longer than the lease's span, and ran when Redis woke, is acknowledged:
// its span counts from Redis's answer, not from its making.
func TestReserveWaitingInAFrozenRedisIsAcknowledged(t *testing.T) {
	const ttl = 600 * time.Millisecond
	f := newFrozenEnvLeased(t, 5, ttl)
	f.freeze(t)
	testenv.Eventually(t, "the lease no longer valid here", 10*time.Second, func() bool { return f.lease.Slot() == 0 })
	type answer struct {
		id  string
		err error
	}
	done := make(chan answer, 1)
	start := time.Now()
	go func() {
		id, err := f.s.Reserve(context.Background(), f.sale, f.item(0), 9)
		done <- answer{id, err}
	}()
	// Past the lease's span of the reservation's making, within its
	// Redis bound (1 s).
	testenv.Eventually(t, "the lease's span since the purchase", 10*time.Second, func() bool { return time.Since(start) > ttl })
	f.thaw(t)
	a := <-done
	if a.err != nil || a.id == "" {
		t.Fatalf("Reserve that waited %v in a frozen Redis = %q, %v; want 202", time.Since(start), a.id, a.err)
	}
}

// A reservation whose command never ran (redis-server killed while frozen,
// and restarted empty) settles as nothing reserved: nothing is published,
// and the shopper buys again with a new order.
func TestReserveUncertainNeverRan(t *testing.T) {
	f := newFrozenEnv(t, 5)
	f.freeze(t)
	lost := f.uncertainID(t, 7)
	f.srv.Kill()
	srv, err := localsvc.StartRedis(context.Background(), localsvc.RedisOptions{Dir: f.srv.Dir, Port: portOf(t, f.srv.Addr)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	// The stock is back (the Reconciler's rebuild, here by hand).
	if err := f.st.Load(context.Background(), f.sale.ID, map[int64]int64{f.item(0).ID: 5}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the uncertain reservation settled", 5*time.Second, func() bool { return f.s.Unsettled() == 0 })
	if v := counterValue(t, f.s.outcomes[OutcomeUncertainNone]); v != 1 {
		t.Fatalf("%s = %v, want 1", OutcomeUncertainNone, v)
	}
	if got := topicRecords(t, f.k, flashsale.TopicOrders); got != 0 {
		t.Fatalf("%d records on %s, want 0", got, flashsale.TopicOrders)
	}
	id, err := f.s.Reserve(context.Background(), f.sale, f.item(0), 7)
	if err != nil || id == "" || id == lost {
		t.Fatalf("Reserve again = %q, %v; want a new order", id, err)
	}
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A claim cut short by a frozen redis-server is uncertain too (503, the
// order's id not known yet). It ran when Redis woke: the gateway finds the
// hold claimed and publishes its order, so the holder's unit is bought,
// not left for the Reconciler to reject.
func TestClaimFrozenRedisSettles(t *testing.T) {
	f := newFrozenEnv(t, 2)
	ctx := context.Background()
	held := uuid.NewString()
	if err := f.st.Hold(ctx, f.sale.ID, f.item(0).ID, 9, held, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	f.freeze(t)
	id, err := f.s.Claim(ctx, f.sale, f.item(0), 9)
	if id != "" || codeOf(err) != flashsale.CodeUnavailable || f.s.Unsettled() != 1 {
		t.Fatalf("Claim with Redis frozen = %q, %v (%d unsettled); want UNAVAILABLE, one to settle", id, err, f.s.Unsettled())
	}
	f.thaw(t)
	testenv.Eventually(t, "the uncertain claim settled", 5*time.Second, func() bool { return f.s.Unsettled() == 0 })
	// Settled means taken out of the set; the publish follows.
	testenv.Eventually(t, "the claimed order's record", 10*time.Second, func() bool {
		return topicRecords(t, f.k, flashsale.TopicOrders) == 1
	})
	if _, _, ok, err := f.st.Held(ctx, f.sale.ID, 9); err != nil || ok {
		t.Fatalf("still held (%v, %v), want claimed", ok, err)
	}
	if b, ok := f.buyer(t, 9); !ok || b.OrderID != held {
		t.Fatalf("buyer record %+v %v, want the held order %s", b, ok, held)
	}
}
