package loadtest

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// TestRealServices checks the Redis command counter and the PostgreSQL
// invariant queries against a real redis-server and PostgreSQL.
func TestRealServices(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	rs, err := localsvc.StartRedis(ctx, localsvc.RedisOptions{Dir: filepath.Join(dir, "redis")})
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Stop() })
	rc, err := newRedisCounter(redisconn.Config{URL: rs.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.close()
	a, err := rc.total(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rc.c.Set(ctx, "k", "v", 0)
	b, err := rc.total(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b-a != 2 { // the SET and the first INFO
		t.Errorf("commands between two INFOs around one SET = %d, want 2", b-a)
	}

	pg, err := localsvc.StartPostgres(ctx, localsvc.PostgresOptions{Dir: filepath.Join(dir, "pg"), Fast: true})
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	pool, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO sales (id, name, starts_at, admission_rate, shuffle_seed, shuffle_commitment) VALUES (7, 's', now(), 10, '\x00', 'x')`)
	exec(`INSERT INTO items (id, sale_id, product_id, quantity, price_cents, sold) VALUES (1001, 7, 1, 2, 100, 2)`)
	exec(`INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at) VALUES
		('00000000-0000-0000-0000-000000000001', 7, 1001, 10, 'PAID', 100, now(), now()),
		('00000000-0000-0000-0000-000000000002', 7, 1001, 11, 'PENDING', 100, now(), now()),
		('00000000-0000-0000-0000-000000000003', 7, 1001, 11, 'EXPIRED', 100, now(), now())`)
	told := []LedgerEntry{{OrderID: "00000000-0000-0000-0000-000000000001"},
		{OrderID: "00000000-0000-0000-0000-000000000002"}, {OrderID: "00000000-0000-0000-0000-000000000003"}}
	r := &Report{Ledger: told}
	r.checkPostgres(ctx, pg.URL, 7)
	if err := r.Err(); err != nil || len(r.Invariants) != 4 {
		t.Fatalf("healthy database: %v (%+v)", err, r.Invariants)
	}
	// The persistence report: rows counted while polled, then the latest
	// created_at and inserted_at read from the rows themselves.
	opens := time.Now().Truncate(time.Millisecond)
	exec(`INSERT INTO sales (id, name, starts_at, admission_rate, shuffle_seed, shuffle_commitment) VALUES (8, 't', now(), 10, '\x00', 'x')`)
	exec(`INSERT INTO items (id, sale_id, product_id, quantity, price_cents, sold) VALUES (1002, 8, 1, 2, 100, 2)`)
	at := func(d time.Duration) string { return opens.Add(d).UTC().Format("2006-01-02 15:04:05.000Z07:00") }
	exec(`INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at, inserted_at) VALUES
		('00000000-0000-0000-0000-000000000011', 8, 1002, 20, 'PAID', 100, '` + at(1500*time.Millisecond) + `', now(), '` + at(4*time.Second) + `'),
		('00000000-0000-0000-0000-000000000012', 8, 1002, 21, 'PENDING', 100, '` + at(3*time.Second) + `', now(), '` + at(3250*time.Millisecond) + `')`)
	poll := startOrderPoller(ctx, pg.URL, 8, opens, 20*time.Millisecond)
	testenv.Eventually(t, "the poller to count the 2 rows", 30*time.Second, func() bool {
		poll.mu.Lock()
		defer poll.mu.Unlock()
		return len(poll.series) > 0 && poll.series[len(poll.series)-1].rows == 2
	})
	pr := poll.stop(2, opens.UnixMilli(), -1)
	if pr.Error != "" || pr.InsertedError != "" || pr.Rows != 2 || pr.AllPersistedMs < 0 {
		t.Errorf("persist report = %+v, want 2 rows seen", pr)
	}
	// The last row written (4 s) is not the last reservation's (3 s).
	if pr.LastInsertedMs != 4000 || pr.InsertedAfterLastCreatedMs != 1000 || pr.LastCreatedMs != 3000 {
		t.Errorf("persist report = %+v, want last inserted 4000 ms, 1000 ms after the last created (3000 ms)", pr)
	}

	// Break all four: a second live order of user 11 (without the index
	// that forbids it), which also puts 3 live orders on 2 units, made an
	// hour before the opening, and never told to the shopper.
	exec(`DROP INDEX orders_one_live_per_user`)
	exec(`INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at) VALUES
		('00000000-0000-0000-0000-000000000004', 7, 1001, 11, 'PENDING', 100, now() - interval '1 hour', now())`)
	r = &Report{Ledger: told}
	r.checkPostgres(ctx, pg.URL, 7)
	for _, c := range r.Invariants {
		if c.OK {
			t.Errorf("%s holds on a broken database: %s", c.Name, c.Detail)
		}
	}
	if r.Err() == nil {
		t.Error("broken database: want an error")
	}
}

// TestRedisCounterCluster: on a Redis Cluster the counter sums every
// master's commands, so keys on any slot count, and one INFO per master
// is all it adds.
func TestRedisCounterCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := localsvc.StartRedisCluster(ctx, localsvc.RedisClusterOptions{Dir: t.TempDir()})
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	rc, err := newRedisCounter(redisconn.Config{Cluster: c.Addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.close()
	a, err := rc.total(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Keys spread over the slots of every master.
	const keys = 30
	for i := range keys {
		if err := rc.c.Set(ctx, "k"+strconv.Itoa(i), "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := rc.total(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Every SET is counted, whichever master holds its key (one master
	// alone holds about a third of them); the client's own commands (INFO,
	// connection set-up) come on top.
	if got := b - a; got < keys {
		t.Errorf("commands between two sums around %d SETs = %d, want at least %d", keys, got, keys)
	}
}
