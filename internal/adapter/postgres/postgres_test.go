package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestOpenMinConns: the pool opens MinConns connections on its own, capped
// at MaxConns, before any query needs them.
func TestOpenMinConns(t *testing.T) {
	url := testenv.DatabaseURL(t)
	for _, tc := range []struct{ min, max, want int32 }{{3, 8, 3}, {12, 4, 4}} {
		pool, err := postgres.Open(context.Background(), postgres.Config{URL: url, MaxConns: tc.max, MinConns: tc.min})
		if err != nil {
			t.Fatal(err)
		}
		testenv.Wait(10*time.Second, func() bool { return pool.Stat().TotalConns() >= tc.want })
		// Give an over-eager pool a moment to open more than it may (Open's
		// own check may add one while MinConns are still opening).
		time.Sleep(200 * time.Millisecond)
		if got := pool.Stat().TotalConns(); got < tc.want || got > tc.max {
			t.Errorf("min %d max %d: %d connections open, want %d…%d", tc.min, tc.max, got, tc.want, tc.max)
		}
		pool.Close()
	}
}
