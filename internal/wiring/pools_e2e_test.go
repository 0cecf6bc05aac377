package wiring_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// TestPoolsWarmAtStart: a started stack holds open Redis and PostgreSQL
// connections before any request needs them (a sale's opening would
// otherwise open them all at once).
func TestPoolsWarmAtStart(t *testing.T) {
	testenv.SkipOnCluster(t, "counts the clients of one node")
	s := startStack(t)
	ctx := context.Background()
	opt, err := redis.ParseURL(s.Config.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	pg, err := pgxpool.New(ctx, s.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	// One process runs every role: the gateway/expiry pool keeps 8 of
	// PostgreSQL, the writer's pool all 4, and the Redis client 64.
	var redisConns, pgConns int
	testenv.EventuallyF(t, func() string {
		return fmt.Sprintf("≥ 64 Redis connections of the stack + this test's and ≥ 12 PostgreSQL after start (%d and %d)", redisConns, pgConns)
	}, 10*time.Second, func() bool {
		list, err := rdb.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		redisConns = strings.Count(list, "\n")
		if err := pg.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&pgConns); err != nil {
			t.Fatal(err)
		}
		return redisConns >= 64+1 && pgConns >= 8+4
	})
}
