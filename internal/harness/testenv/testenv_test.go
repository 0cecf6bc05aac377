package testenv

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestMain(m *testing.M) { Main(m) }

func TestServicesIsolated(t *testing.T) {
	SkipOnCluster(t, "two logical databases in one test")
	ctx := context.Background()
	a, b := Redis(t), Redis(t)
	if err := a.Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("second database sees the first's key: n=%d err=%v", n, err)
	}
	p1, p2 := Postgres(t), Postgres(t)
	if _, err := p1.Exec(ctx, `INSERT INTO sales (name, starts_at, admission_rate, shuffle_seed, shuffle_commitment) VALUES ('x', now(), 1, '\x00', '')`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := p2.QueryRow(ctx, `SELECT count(*) FROM sales`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("second database sees %d sales (err %v), want 0", n, err)
	}
	k := NewKafka(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "flash-sale-orders", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// TestClusterMode: in cluster mode Redis hands out a cluster client that
// reaches every master, and each test starts on an empty cluster.
func TestClusterMode(t *testing.T) {
	if !Cluster() {
		t.Skip("FLASHSALE_TEST_REDIS is not cluster")
	}
	ctx := context.Background()
	rdb := Redis(t)
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		t.Fatalf("Redis(t) = %T, want a cluster client", rdb)
	}
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		if err := rdb.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if got := keyCount(t, rdb); got != 6 {
		t.Fatalf("keys over the masters = %d, want 6", got)
	}
	t.Run("next test", func(t *testing.T) {
		if got := keyCount(t, Redis(t)); got != 0 {
			t.Fatalf("a new test finds %d keys, want an empty cluster", got)
		}
	})
}

func keyCount(t *testing.T, rdb redis.UniversalClient) int64 {
	t.Helper()
	var n atomic.Int64
	err := rdb.(*redis.ClusterClient).ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		k, err := c.DBSize(ctx).Result()
		n.Add(k)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n.Load()
}

// TestDurableDatabase: the crash tests' server waits for the WAL at a
// commit; the shared one does not.
func TestDurableDatabase(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, url, want string
	}{
		{"DatabaseURL", DatabaseURL(t), "off"},
		{"DurableDatabaseURL", DurableDatabaseURL(t), "on"},
	} {
		pool, err := pgxpool.New(ctx, tc.url)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got)
		pool.Close()
		if err != nil || got != tc.want {
			t.Errorf("%s: synchronous_commit = %q (%v), want %q", tc.name, got, err, tc.want)
		}
	}
}
