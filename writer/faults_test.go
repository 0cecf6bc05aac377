package writer

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
	"github.com/flashsale/flashsale/purchase"
	"github.com/flashsale/flashsale/reconcile"
	"github.com/flashsale/flashsale/sales"
)

// Faults of the Kafka side: a writer down or killed, Redis losing its data,
// the broker restarted. Each goes through the real parts: the purchase
// service publishing to kfake, the writer, the reconciler asking Kafka.

// saleList is a reconcile.SaleLister of fixed sales.
type saleList []*flashsale.Sale

func (l saleList) Sales() []*flashsale.Sale { return l }

// offsetClock is the reconciler's clock, set ahead of the wall clock.
type offsetClock struct{ ahead time.Duration }

func (c *offsetClock) now() time.Time { return time.Now().Add(c.ahead) }

func newProducer(t testing.TB, brokers []string) *kafka.Producer {
	t.Helper()
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: brokers, PublishTimeout: 2 * time.Second, CloseTimeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func newOrderLog(t testing.TB, brokers []string) *kafka.OrderLog {
	t.Helper()
	l, err := kafka.NewOrderLog(kafka.OrderLogConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// startService runs a purchase service on st and pub until the test ends.
func startService(t testing.TB, st *redisstock.Store, pub purchase.Publisher) *purchase.Service {
	t.Helper()
	s := purchase.New(purchase.Config{}, st, pub, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// buy reserves through the service and fails the test unless it got a 202.
func buy(t testing.TB, s *purchase.Service, sale *flashsale.Sale, item flashsale.Item, user int64) string {
	t.Helper()
	id, err := s.Reserve(context.Background(), sale, item, user)
	if err != nil {
		t.Fatalf("user %d: Reserve: %v", user, err)
	}
	return id
}

func placedCount(t testing.TB, rdb redis.UniversalClient, saleID int64) int64 {
	t.Helper()
	return intResult(t, rdb.HLen(context.Background(), lua.PlacedKey(saleID)))
}

func statusCount(t testing.TB, pool *pgxpool.Pool, saleID int64, status string) int {
	t.Helper()
	return countRows(t, pool, `SELECT count(*) FROM orders WHERE sale_id = $1 AND status = $2`, saleID, status)
}

func remainingOf(t testing.TB, st *redisstock.Store, saleID, itemID int64) int64 {
	t.Helper()
	left, err := st.ItemsRemaining(context.Background(), saleID, []int64{itemID})
	if err != nil {
		t.Fatal(err)
	}
	return left[0]
}

// The writer is down longer than the reconciler's bound while acknowledged
// orders wait in Kafka: the reconciler rejects none of them (nor an order
// whose uncertain publish landed), and declares lost only the reservation
// whose record never reached the broker, once the writer has consumed
// everything.
func TestReconcilerNeverRejectsWhatKafkaHolds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 20)
	item := sale.Items[0]
	svc := startService(t, e.stock, newProducer(t, e.kafka.Brokers))
	acked := map[string]bool{}
	for u := int64(1); u <= 8; u++ {
		acked[buy(t, svc, &sale, item, u)] = true
	}
	waitFor(t, "the Kafka positions of the 8 orders in Redis", func() bool { return placedCount(t, e.rdb, sale.ID) == 8 })
	// An uncertain publish that landed (no position kept) and a
	// reservation whose gateway died before publishing.
	landed := e.reserve(t, item, 100)
	e.publish(t, landed)
	lost := e.reserve(t, item, 101)

	clk := &offsetClock{ahead: time.Hour}
	rec := reconcile.New(reconcile.Config{After: time.Minute, Now: clk.now, Orders: newOrderLog(t, e.kafka.Brokers)},
		e.pool, e.stock, saleList{&sale}, testLogger(t), nil)
	ctx := context.Background()
	if n, err := rec.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("RunOnce with the writer down = %d, %v; want 0, nil", n, err)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d order rows written while the writer was down (tombstones), want 0", n)
	}
	if n := pendingCount(t, e.rdb, sale.ID); n != 10 {
		t.Fatalf("%d reservations pending, want all 10 kept", n)
	}

	// The writer comes back and consumes everything.
	e.start(t, Config{})
	waitFor(t, "the 9 orders in Kafka to reach the database", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM orders WHERE sale_id = $1`, sale.ID) == 9
	})
	waitFor(t, "the writer group to commit its offsets", func() bool { return committed(t, e.kafka.Brokers, kafka.DefaultWriterGroup) == 9 })
	if n, err := rec.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce with the writer caught up = %d, %v; want 1 (the lost reservation), nil", n, err)
	}
	rows := orderRows(t, e.pool, sale.ID)
	for id := range acked {
		if rows[id].status != string(flashsale.OrderPending) {
			t.Errorf("acknowledged order %s is %q, want PENDING", id, rows[id].status)
		}
	}
	if got := rows[landed.OrderID].status; got != string(flashsale.OrderPending) {
		t.Errorf("landed order is %q, want PENDING", got)
	}
	if got := rows[lost.OrderID]; got.status != string(flashsale.OrderRejected) || got.reason != reconcile.RejectLost {
		t.Errorf("lost reservation row %+v, want REJECTED %q", got, reconcile.RejectLost)
	}
	// Conservation: remaining + live = quantity.
	if left, live := remainingOf(t, e.stock, sale.ID, item.ID), sold(t, e.pool, item.ID); left+live != 20 || live != 9 {
		t.Errorf("remaining %d + sold %d, want 11 + 9", left, live)
	}
	waitFor(t, "the pending set and positions to empty", func() bool {
		return pendingCount(t, e.rdb, sale.ID) == 0 && placedCount(t, e.rdb, sale.ID) == 0
	})
}

// Redis loses everything while acknowledged orders are still in Kafka: no
// purchase is answered SOLD_OUT meanwhile (503, nothing reserved, no
// sold-out flag), the rebuild counts the orders in flight, and no order
// acknowledged before or after it is refused by the database.
func TestRebuildCountsOrdersInKafka(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 10)
	item := sale.Items[0]
	svc := startService(t, e.stock, newProducer(t, e.kafka.Brokers))
	acked := map[string]bool{}
	// Two orders reach the database, then the writer stops; four more
	// wait in Kafka.
	for u := int64(1); u <= 2; u++ {
		acked[buy(t, svc, &sale, item, u)] = true
	}
	w := e.start(t, Config{})
	waitFor(t, "2 orders in the database", func() bool { return sold(t, e.pool, item.ID) == 2 })
	waitFor(t, "the writer group to commit", func() bool { return committed(t, e.kafka.Brokers, kafka.DefaultWriterGroup) == 2 })
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
	w.w.Close()
	for u := int64(3); u <= 6; u++ {
		acked[buy(t, svc, &sale, item, u)] = true
	}

	ctx := context.Background()
	if err := testenv.Flush(ctx, e.rdb); err != nil {
		t.Fatal(err)
	}
	// While the stock record is missing: 503, nothing reserved, no flag.
	if _, err := svc.Reserve(ctx, &sale, item, 50); flashsale.ErrorCode(err) != flashsale.CodeUnavailable {
		t.Fatalf("purchase with the stock lost: %v, want UNAVAILABLE", err)
	}
	if svc.SoldOut(item.ID) {
		t.Fatal("the sold-out flag was set by a lost stock record")
	}
	clk := &offsetClock{}
	rec := reconcile.New(reconcile.Config{Now: clk.now, Orders: newOrderLog(t, e.kafka.Brokers)},
		e.pool, e.stock, saleList{&sale}, testLogger(t), nil)
	if _, err := rec.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := remainingOf(t, e.stock, sale.ID, item.ID); got != -1 {
		t.Fatalf("stock rebuilt before publishes in flight settled: %d", got)
	}
	rebuildPastPublishTimeout(t, svc, &sale, item, 51, clk, rec)
	if got := remainingOf(t, e.stock, sale.ID, item.ID); got != 4 {
		t.Fatalf("remaining after the rebuild %d, want 10 − (2 in PostgreSQL + 4 in Kafka) = 4", got)
	}
	// Buyers in flight keep their one order.
	if _, err := svc.Reserve(ctx, &sale, item, 4); flashsale.ErrorCode(err) != flashsale.CodeAlreadyPurchased {
		t.Errorf("a buyer in flight buys again: %v, want ALREADY_PURCHASED", err)
	}
	// The rest sells, and no more; a writer then stores every
	// acknowledged order as PENDING.
	sellRestAndSettle(t, e, svc, &sale, item, acked)
	if left, live := remainingOf(t, e.stock, sale.ID, item.ID), sold(t, e.pool, item.ID); left != 0 || live != 10 {
		t.Errorf("remaining %d, sold %d; want 0, 10", left, live)
	}
}

// A helper process runs a writer when the test binary is started with
// writerHelperEnv set (see TestMain): a writer the test can kill -9.
const writerHelperEnv = "FLASHSALE_TEST_WRITER_HELPER"

// runWriterHelper runs a writer from the environment until SIGTERM.
func runWriterHelper() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "writer helper:", err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv("FS_HELPER_DATABASE_URL"))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	opt, err := redis.ParseURL(os.Getenv("FS_HELPER_REDIS_URL"))
	if err != nil {
		return fail(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	session, err := time.ParseDuration(os.Getenv("FS_HELPER_SESSION_TIMEOUT"))
	if err != nil {
		return fail(err)
	}
	w, err := New(Config{Brokers: strings.Split(os.Getenv("FS_HELPER_BROKERS"), ","), SessionTimeout: session, BatchSize: 20},
		pool, redisstock.New(rdb), nil, nil)
	if err != nil {
		return fail(err)
	}
	err = w.Run(ctx)
	w.Close()
	if err != nil {
		return fail(err)
	}
	return 0
}

// writerProcess is a writer running in a child process.
type writerProcess struct {
	cmd  *exec.Cmd
	done chan error
}

func startWriterProcess(t *testing.T, brokers []string, dbURL, redisURL string, session time.Duration) *writerProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		writerHelperEnv+"=1",
		"FS_HELPER_BROKERS="+strings.Join(brokers, ","),
		"FS_HELPER_DATABASE_URL="+dbURL,
		"FS_HELPER_REDIS_URL="+redisURL,
		"FS_HELPER_SESSION_TIMEOUT="+session.String())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &writerProcess{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// A writer killed with SIGKILL in the middle of the stream, and another
// started: the new one consumes again once the dead one's session timed
// out, the reconciler rejects nothing meanwhile, and every acknowledged order
// reaches the database once.
func TestWriterKilledAndRestarted(t *testing.T) {
	t.Parallel()
	const session = time.Second
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(4, flashsale.TopicOrders, flashsale.TopicDeadLetter),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	// A database whose commits wait for the WAL: what the killed writer
	// committed is kept for what it is.
	dbURL, redisURL := testenv.DurableDatabaseURL(t), testenv.RedisURL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	st := redisstock.New(rdb)
	sl := sales.NewStore(pool, rdb, st, nil)
	e := &env{pool: pool, rdb: rdb, stock: st, sales: sl}
	sale := e.newSale(t, 400)
	item := sale.Items[0]
	svc := startService(t, st, newProducer(t, brokers))
	acked := map[string]bool{}
	for u := int64(1); u <= 200; u++ {
		acked[buy(t, svc, &sale, item, u)] = true
	}

	first := startWriterProcess(t, brokers, dbURL, redisURL, session)
	waitFor(t, "the first writer to store some orders", func() bool { return sold(t, pool, item.ID) > 0 })
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-first.done; err == nil {
		t.Fatal("the killed writer exited cleanly")
	}
	first.done <- nil // for the cleanup
	for u := int64(201); u <= 300; u++ {
		acked[buy(t, svc, &sale, item, u)] = true
	}
	// The reconciler, with every reservation past its bound, while no
	// writer runs: it rejects nothing.
	rec := reconcile.New(reconcile.Config{After: time.Minute, Now: (&offsetClock{ahead: time.Hour}).now,
		Orders: newOrderLog(t, brokers)}, pool, st, saleList{&sale}, testLogger(t), nil)
	if _, err := rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := statusCount(t, pool, sale.ID, string(flashsale.OrderRejected)); n != 0 {
		t.Fatalf("%d orders REJECTED while the writer was down, want 0", n)
	}

	startWriterProcess(t, brokers, dbURL, redisURL, session)
	waitFor(t, "every acknowledged order in the database", func() bool {
		return countRows(t, pool, `SELECT count(*) FROM orders WHERE sale_id = $1`, sale.ID) == len(acked)
	})
	rows := orderRows(t, pool, sale.ID)
	for id := range acked {
		if rows[id].status != string(flashsale.OrderPending) {
			t.Errorf("acknowledged order %s is %q, want PENDING", id, rows[id].status)
		}
	}
	if left, live := remainingOf(t, st, sale.ID, item.ID), sold(t, pool, item.ID); left+live != 400 || live != int64(len(acked)) {
		t.Errorf("remaining %d + sold %d, want %d + %d", left, live, 400-len(acked), len(acked))
	}
	waitFor(t, "the pending set to empty", func() bool { return pendingCount(t, rdb, sale.ID) == 0 })
	if _, err := rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := statusCount(t, pool, sale.ID, string(flashsale.OrderRejected)); n != 0 {
		t.Errorf("%d orders REJECTED, want 0", n)
	}
}

// freePort returns a TCP port of 127.0.0.1 free at the moment.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The broker goes away and comes back on the same port, with its data
// (persisted) or empty (re-created: the topics get new IDs). Meanwhile a
// purchase fails within its bound (503); afterwards the same producer
// publishes again and the same writer consumes again, without a restart of
// their own, and every acknowledged order reaches the database.
func TestSurvivesBrokerRestart(t *testing.T) {
	for _, persisted := range []bool{true, false} {
		name := map[bool]string{true: "persisted", false: "empty"}[persisted]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			port, dir := freePort(t), t.TempDir()
			opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port),
				kfake.SeedTopics(4, flashsale.TopicOrders, flashsale.TopicDeadLetter),
				kfake.GroupMinSessionTimeout(100 * time.Millisecond)}
			if persisted {
				opts = append(opts, kfake.DataDir(dir))
			}
			c, err := kfake.NewCluster(opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			brokers := c.ListenAddrs()
			e := &env{pool: testenv.Postgres(t), rdb: testenv.Redis(t), kafka: &testenv.Kafka{Cluster: c, Brokers: brokers}}
			e.stock = redisstock.New(e.rdb)
			e.sales = sales.NewStore(e.pool, e.rdb, e.stock, nil)
			sale := e.newSale(t, 100)
			item := sale.Items[0]
			svc := startService(t, e.stock, newProducer(t, brokers))
			e.start(t, Config{SessionTimeout: time.Second})
			acked := map[string]bool{}
			for u := int64(1); u <= 5; u++ {
				acked[buy(t, svc, &sale, item, u)] = true
			}
			waitFor(t, "the first orders in the database", func() bool { return sold(t, e.pool, item.ID) == 5 })

			c.Close()
			// With no deadline of the caller's, only the publish bound
			// ends this call.
			_, err = svc.Reserve(context.Background(), &sale, item, 50)
			if flashsale.ErrorCode(err) != flashsale.CodeUnavailable {
				t.Fatalf("purchase with the broker down: %v, want UNAVAILABLE", err)
			}
			c2, err := kfake.NewCluster(opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c2.Close() })

			// The producer publishes again: keep buying until a 202.
			user := int64(100)
			waitFor(t, "a purchase acknowledged after the restart", func() bool {
				user++
				id, err := svc.Reserve(context.Background(), &sale, item, user)
				if err == nil {
					acked[id] = true
				}
				return err == nil
			})
			// Every producer recovers: more purchases, each retried as
			// a shopper would until it is acknowledged.
			for range 8 {
				waitFor(t, "another purchase acknowledged", func() bool {
					user++
					id, err := svc.Reserve(context.Background(), &sale, item, user)
					if err == nil {
						acked[id] = true
					}
					return err == nil
				})
			}
			waitFor(t, "every acknowledged order in the database", func() bool {
				n := 0
				rows := orderRows(t, e.pool, sale.ID)
				for id := range acked {
					if rows[id].status == string(flashsale.OrderPending) {
						n++
					}
				}
				return n == len(acked)
			})
		})
	}
}

// replicaOffset waits until the replica's applied replication offset has
// reached the master's.
func waitReplicated(t testing.TB, master, replica *redis.Client) {
	t.Helper()
	field := func(c *redis.Client, name string) string {
		info, err := c.Info(context.Background(), "replication").Result()
		if err != nil {
			return ""
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
				return v
			}
		}
		return ""
	}
	waitFor(t, "the replica to catch up", func() bool {
		m := field(master, "master_repl_offset")
		return field(replica, "master_link_status") == "up" && m != "" && field(replica, "slave_repl_offset") == m
	})
}

// Redis fails over to a replica that missed the last reservations (a real
// replica, promoted): the reconciler sees another dataset, the sale's
// purchases answer 503 until its stock is rebuilt from PostgreSQL and
// Kafka, and no acknowledged order is refused by the database later.
func TestFailoverToStaleReplica(t *testing.T) {
	t.Parallel()
	master, replica := testenv.NewRedisServer(t), testenv.NewRedisServer(t)
	mc := redis.NewClient(&redis.Options{Addr: master.Addr})
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	t.Cleanup(func() { mc.Close(); rc.Close() })
	host, port, _ := strings.Cut(master.Addr, ":")
	ctx := context.Background()
	if err := rc.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	// The gateway's client follows the current master, as a Sentinel
	// client would.
	var current atomic.Value
	current.Store(master.Addr)
	rdb := redis.NewClient(&redis.Options{Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, current.Load().(string))
	}})
	t.Cleanup(func() { rdb.Close() })
	e := &env{pool: testenv.Postgres(t), rdb: rdb, kafka: testenv.NewKafka(t)}
	e.stock = redisstock.New(rdb)
	e.sales = sales.NewStore(e.pool, rdb, e.stock, nil)
	// Reservations go through the shared pipeline, as on a gateway: the
	// promoted replica has never seen the script (NOSCRIPT), and the
	// pipeline loads it again.
	pctx, stopPipe := context.WithCancel(ctx)
	piped := make(chan error, 1)
	go func() { piped <- e.stock.RunPipeline(pctx, 1) }()
	t.Cleanup(func() { stopPipe(); <-piped })
	sale := e.newSale(t, 10)
	item := sale.Items[0]
	svc := startService(t, e.stock, newProducer(t, e.kafka.Brokers))
	clk := &offsetClock{}
	rec := reconcile.New(reconcile.Config{Now: clk.now, Orders: newOrderLog(t, e.kafka.Brokers)},
		e.pool, e.stock, saleList{&sale}, testLogger(t), nil)
	if _, err := rec.RunOnce(ctx); err != nil { // sees the master's dataset
		t.Fatal(err)
	}
	acked := map[string]bool{}
	for u := int64(1); u <= 3; u++ {
		acked[buy(t, svc, &sale, item, u)] = true
	}
	waitReplicated(t, mc, rc)
	// The replica is promoted; the master takes three more reservations
	// the replica never sees, then dies.
	if err := rc.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	for u := int64(4); u <= 6; u++ {
		acked[buy(t, svc, &sale, item, u)] = true
	}
	current.Store(replica.Addr)
	master.Kill()
	if got := remainingOf(t, e.stock, sale.ID, item.ID); got != 7 {
		t.Fatalf("the promoted replica has %d units, want the stale 7", got)
	}

	if _, err := rec.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	rebuildPastPublishTimeout(t, svc, &sale, item, 50, clk, rec)
	if got := remainingOf(t, e.stock, sale.ID, item.ID); got != 4 {
		t.Fatalf("remaining after the rebuild %d, want 10 − 6 in Kafka = 4", got)
	}
	sellRestAndSettle(t, e, svc, &sale, item, acked)
	if pipes, calls := e.stock.PipelineStats(); pipes == 0 || calls == 0 {
		t.Errorf("no reservation went through the pipeline (%d pipelines, %d calls)", pipes, calls)
	}
}

// groupMembers is the number of members of the writer group.
func groupMembers(t testing.TB, brokers []string) int {
	t.Helper()
	ctx, adm, done := adminClient(t, brokers)
	defer done()
	gs, err := adm.DescribeGroups(ctx, kafka.DefaultWriterGroup)
	if err != nil {
		t.Fatal(err)
	}
	g, ok := gs[kafka.DefaultWriterGroup]
	if !ok || g.Err != nil {
		return 0
	}
	return len(g.Members)
}

// A writer stopped with SIGTERM leaves the group on its way out, so its
// partitions go to the next writer at once rather than after its session
// timeout.
func TestWriterLeavesGroupOnSIGTERM(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	dbURL, redisURL := testenv.DatabaseURL(t), testenv.RedisURL(t)
	p := startWriterProcess(t, k.Brokers, dbURL, redisURL, time.Minute)
	waitFor(t, "the writer to join the group", func() bool { return groupMembers(t, k.Brokers) == 1 })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-p.done; err != nil {
		t.Fatalf("writer after SIGTERM: %v, want a clean exit", err)
	}
	p.done <- nil // for the cleanup
	if n := groupMembers(t, k.Brokers); n != 0 {
		t.Errorf("%d members left in the group after the writer stopped, want 0 (it left)", n)
	}
}
