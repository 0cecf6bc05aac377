// Package testenv starts real services for a test package: one redis-server
// and one PostgreSQL cluster per package (in TestMain, through Main), and a
// fresh in-process Kafka (kfake) per test. Every test gets its own Redis
// logical database and its own PostgreSQL database created from a migrated
// template, so tests are isolated and may run in parallel.
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package testenv

import (
	"context"
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
	"github.com/flashsale/flashsale/internal/harness/localsvc"
)

const (
	redisDatabases = 4096
	templateDB     = "fs_template"
)

var (
	env struct {
		redis   *localsvc.Redis
		pg      *localsvc.Postgres
		dir     string
		started bool
	}
	nextRedisDB atomic.Int64
	nextPGDB    atomic.Int64
	pgCreateMu  sync.Mutex // CREATE DATABASE ... TEMPLATE takes the template exclusively
)

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
	r, err := localsvc.StartRedis(ctx, localsvc.RedisOptions{Dir: filepath.Join(dir, "redis"), Databases: redisDatabases})
	if err != nil {
		return 1, err
	}
	env.redis = r
	defer r.Stop()
	pg, err := localsvc.StartPostgres(ctx, localsvc.PostgresOptions{Dir: filepath.Join(dir, "pg"), Fast: true})
	if err != nil {
		return 1, err
	}
	env.pg = pg
	defer pg.Stop()
	if err := makeTemplate(ctx); err != nil {
		return 1, err
	}
	env.started = true
	return m.Run(), nil
}

func makeTemplate(ctx context.Context) error {
	admin, err := pgxpool.New(ctx, env.pg.URL)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+templateDB); err != nil {
		return fmt.Errorf("create template: %w", err)
	}
	pool, err := pgxpool.New(ctx, env.pg.DatabaseURL(templateDB))
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

// RedisURL returns the URL of a fresh, empty Redis logical database for this
// test.
func RedisURL(t testing.TB) string {
	t.Helper()
	mustStarted(t)
	n := nextRedisDB.Add(1)
	if n >= redisDatabases {
		t.Fatalf("testenv: more than %d Redis databases used in one package", redisDatabases-1)
	}
	return fmt.Sprintf("redis://%s/%d", env.redis.Addr, n)
}

// Redis returns a client on a fresh Redis logical database, closed when the
// test ends.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// RedisAddr is the address of the package's redis-server (for tools that
// look at the whole server, such as INFO commandstats).
func RedisAddr() string { return env.redis.Addr }

// DatabaseURL creates a fresh database with the current schema for this test
// and returns its URL; it is dropped when the test ends.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	mustStarted(t)
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), nextPGDB.Add(1))
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, env.pg.URL)
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
		a, err := pgxpool.New(context.Background(), env.pg.URL)
		if err != nil {
			return
		}
		defer a.Close()
		_, _ = a.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return env.pg.DatabaseURL(name)
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

// NewKafka starts a kfake cluster with the order and dead-letter topics
// (4 partitions each) and closes it when the test ends. Tests may Close it
// earlier to simulate a broker outage.
func NewKafka(t testing.TB) *Kafka {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(4, flashsale.TopicOrders, flashsale.TopicDeadLetter),
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
