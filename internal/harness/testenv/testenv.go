// Package testenv starts real services for a test package: one redis-server
// and one PostgreSQL cluster per package (in TestMain, through Main), and a
// fresh in-process Kafka (kfake) per test. Every test gets its own Redis
// logical database and its own PostgreSQL database created from a migrated
// template, so tests are isolated and may run in parallel.
//
// With FLASHSALE_TEST_REDIS=cluster, Main starts a local 3-master Redis
// Cluster instead of the one redis-server, and Redis and RedisConfig hand
// out clients of that cluster. A cluster has only database 0, so each test
// that asks for Redis finds every master flushed; run that pass with
// `-parallel 1` so no two tests share the cluster at once (Main refuses to
// run it otherwise). Tests that need one node's features (a logical
// database's URL, replicaof, a killed server) skip there with the reason.
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package testenv

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
)

const (
	redisDatabases = 4096
	templateDB     = "fs_template"
)

var (
	env struct {
		redis   *localsvc.Redis
		cluster *localsvc.RedisCluster // FLASHSALE_TEST_REDIS=cluster
		pg      *localsvc.Postgres
		dir     string
		started bool
	}
	nextRedisDB atomic.Int64
	nextPGDB    atomic.Int64
	pgCreateMu  sync.Mutex // CREATE DATABASE ... TEMPLATE takes the template exclusively

	// durable is the second PostgreSQL cluster, started on the first
	// DurableDatabaseURL: synchronous_commit on, for crash tests.
	durable struct {
		once sync.Once
		pg   *localsvc.Postgres
		err  error
	}

	// clusterMu guards clusterOwner, the test the cluster was last flushed
	// for: its later calls share the cluster rather than flush it again.
	clusterMu    sync.Mutex
	clusterOwner testing.TB
)

// ClusterModeEnv selects the Redis the harness starts: "cluster" for a
// local 3-master Redis Cluster, empty for one redis-server.
const ClusterModeEnv = "FLASHSALE_TEST_REDIS"

// Main starts the services, runs the package's tests and stops the services.
// It never returns.
func Main(m *testing.M) {
	code, err := run(m)
	if err != nil {
		log.Printf("testenv: %v", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "flashsale-test-")
	if err != nil {
		return 1, err
	}
	env.dir = dir
	defer os.RemoveAll(dir)
	defer func() {
		if durable.pg != nil {
			_ = durable.pg.Stop()
		}
	}()
	switch mode := os.Getenv(ClusterModeEnv); mode {
	case "":
		r, err := localsvc.StartRedis(ctx, localsvc.RedisOptions{Dir: filepath.Join(dir, "redis"), Databases: redisDatabases})
		if err != nil {
			return 1, err
		}
		env.redis = r
		defer r.Stop()
	case "cluster":
		// Tests share the cluster's one database: they must run one at a
		// time, or one test's flush would empty another's keys.
		if !flag.Parsed() {
			flag.Parse() // m.Run would parse them later; -parallel is needed now
		}
		if p := flag.Lookup("test.parallel"); p == nil || p.Value.String() != "1" {
			return 1, fmt.Errorf("%s=cluster needs go test -parallel 1 (tests share the cluster's one database)", ClusterModeEnv)
		}
		c, err := localsvc.StartRedisCluster(ctx, localsvc.RedisClusterOptions{Dir: filepath.Join(dir, "redis-cluster")})
		if err != nil {
			return 1, err
		}
		env.cluster = c
		defer c.Stop()
	default:
		return 1, fmt.Errorf("%s=%q: want cluster or nothing", ClusterModeEnv, mode)
	}
	pg, err := localsvc.StartPostgres(ctx, localsvc.PostgresOptions{Dir: filepath.Join(dir, "pg"), Fast: true})
	if err != nil {
		return 1, err
	}
	env.pg = pg
	defer pg.Stop()
	if err := makeTemplate(ctx, pg); err != nil {
		return 1, err
	}
	env.started = true
	return m.Run(), nil
}

func makeTemplate(ctx context.Context, pg *localsvc.Postgres) error {
	admin, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+templateDB); err != nil {
		return fmt.Errorf("create template: %w", err)
	}
	pool, err := pgxpool.New(ctx, pg.DatabaseURL(templateDB))
	if err != nil {
		return err
	}
	defer pool.Close()
	return postgres.Migrate(ctx, pool)
}

func mustStarted(t testing.TB) {
	t.Helper()
	if !env.started {
		t.Fatal("testenv: services not started; call testenv.Main(m) from TestMain")
	}
}

// Cluster reports whether this run hands out a Redis Cluster
// (FLASHSALE_TEST_REDIS=cluster).
func Cluster() bool { return env.cluster != nil }

// SkipOnCluster skips a test that needs one node's features when the run
// is on a Redis Cluster.
func SkipOnCluster(t testing.TB, why string) {
	t.Helper()
	if Cluster() {
		t.Skipf("testenv: needs a single Redis node (%s); this run is on a Redis Cluster", why)
	}
}

// RedisURL returns the URL of a fresh, empty Redis logical database for this
// test. A cluster has no logical databases: there the test is skipped (use
// RedisConfig).
func RedisURL(t testing.TB) string {
	t.Helper()
	mustStarted(t)
	SkipOnCluster(t, "a redis:// URL of its own logical database")
	n := nextRedisDB.Add(1)
	if n >= redisDatabases {
		t.Fatalf("testenv: more than %d Redis databases used in one package", redisDatabases-1)
	}
	return fmt.Sprintf("redis://%s/%d", env.redis.Addr, n)
}

// RedisConfig returns the settings of an empty Redis for this test: a
// fresh logical database of the package's redis-server, or (cluster mode)
// the cluster's seeds, every master flushed on the test's first call.
func RedisConfig(t testing.TB) redisconn.Config {
	t.Helper()
	mustStarted(t)
	if env.cluster == nil {
		return redisconn.Config{URL: RedisURL(t)}
	}
	cfg := redisconn.Config{Cluster: env.cluster.Addrs}
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if clusterOwner != t {
		rdb, err := redisconn.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		if err := Flush(context.Background(), rdb); err != nil {
			t.Fatalf("testenv: flush the cluster: %v", err)
		}
		clusterOwner = t
	}
	return cfg
}

// Redis returns a client on an empty Redis (see RedisConfig), closed when
// the test ends.
func Redis(t testing.TB) redis.UniversalClient {
	t.Helper()
	c, err := redisconn.New(RedisConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Flush empties the database of every master rdb reaches (FLUSHDB on one
// node would leave a cluster's other masters' keys): tests of Redis loss.
func Flush(ctx context.Context, rdb redis.UniversalClient) error {
	return redisconn.ForEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		return c.FlushDB(ctx).Err()
	})
}

// Keys is KEYS pattern over every master of rdb (one node, or each master
// of a cluster, where KEYS sees only the node it is sent to).
func Keys(t testing.TB, rdb redis.UniversalClient, pattern string) []string {
	t.Helper()
	var mu sync.Mutex
	var keys []string
	err := redisconn.ForEachMaster(context.Background(), rdb, func(ctx context.Context, c *redis.Client) error {
		ks, err := c.Keys(ctx, pattern).Result()
		mu.Lock()
		keys = append(keys, ks...)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatalf("testenv.Keys %q: %v", pattern, err)
	}
	return keys
}

// RedisAddr is the address of the package's redis-server (for tools that
// look at the whole server, such as INFO commandstats); on a cluster, the
// first master's.
func RedisAddr() string {
	if env.cluster != nil {
		return env.cluster.Addrs[0]
	}
	return env.redis.Addr
}

// DatabaseURL creates a fresh database with the current schema for this test
// and returns its URL; it is dropped when the test ends. Its server does
// not wait for the WAL at a commit (synchronous_commit=off): a test that
// kills PostgreSQL or a writer and checks what was kept takes
// DurableDatabaseURL.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	mustStarted(t)
	return newDatabase(t, env.pg)
}

// DurableDatabaseURL is DatabaseURL on a second PostgreSQL server, started
// at the first call, whose commits return only once their WAL record is
// written (localsvc.PostgresOptions.SyncCommit): a crash test's database,
// where every acknowledged commit survives a kill of the server or of
// any client.
func DurableDatabaseURL(t testing.TB) string {
	t.Helper()
	mustStarted(t)
	durable.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pg, err := localsvc.StartPostgres(ctx, localsvc.PostgresOptions{Dir: filepath.Join(env.dir, "pg-durable"), Fast: true, SyncCommit: true})
		if err == nil {
			if err = makeTemplate(ctx, pg); err != nil {
				_ = pg.Stop()
			}
		}
		if err != nil {
			durable.err = err
			return
		}
		durable.pg = pg
	})
	if durable.err != nil {
		t.Fatalf("testenv: the durable PostgreSQL: %v", durable.err)
	}
	return newDatabase(t, durable.pg)
}

// newDatabase creates a database from pg's template for this test and
// returns its URL; it is dropped when the test ends.
func newDatabase(t testing.TB, pg *localsvc.Postgres) string {
	t.Helper()
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), nextPGDB.Add(1))
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	pgCreateMu.Lock()
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+templateDB)
	pgCreateMu.Unlock()
	if err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		a, err := pgxpool.New(context.Background(), pg.URL)
		if err != nil {
			return
		}
		defer a.Close()
		_, _ = a.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return pg.DatabaseURL(name)
}

// Postgres returns a pool on a fresh database with the current schema,
// closed when the test ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Kafka is an in-process Kafka broker (kfake) owned by one test.
type Kafka struct {
	Cluster *kfake.Cluster
	Brokers []string
}

// NewKafka starts a kfake cluster with the order, dead-letter and order-event topics
// (4 partitions each) and closes it when the test ends. Tests may Close it
// earlier to simulate a broker outage.
func NewKafka(t testing.TB) *Kafka {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(4, flashsale.TopicOrders, flashsale.TopicDeadLetter, flashsale.TopicOrderEvents),
		kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatalf("testenv: kfake: %v", err)
	}
	var once sync.Once
	k := &Kafka{Cluster: c, Brokers: c.ListenAddrs()}
	t.Cleanup(func() { once.Do(c.Close) })
	return k
}

// BrokerList is the comma-separated broker list (FLASHSALE_KAFKA_BROKERS form).
func (k *Kafka) BrokerList() string { return strings.Join(k.Brokers, ",") }

// NewRedisServer starts a dedicated redis-server for one test (for tests that
// kill or restart Redis). It is stopped when the test ends.
func NewRedisServer(t testing.TB) *localsvc.Redis {
	t.Helper()
	mustStarted(t)
	dir, err := os.MkdirTemp(env.dir, "redis-")
	if err != nil {
		t.Fatal(err)
	}
	r, err := localsvc.StartRedis(context.Background(), localsvc.RedisOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop() })
	return r
}
