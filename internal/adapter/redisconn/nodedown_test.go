package redisconn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
)

// This test is outside the package so that it may wait with testenv,
// which imports redisconn.

// TestClusterNodeDown: with one master down, readiness fails and a
// reservation whose sale lives on that master is refused with an error
// (never reserved, never sold out); once the node is back, the stock is
// whole and the reservation goes through.
func TestClusterNodeDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := localsvc.StartRedisCluster(ctx, localsvc.RedisClusterOptions{Dir: t.TempDir(), Persist: true})
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	rdb, err := redisconn.Open(ctx, redisconn.Config{Cluster: c.Addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	st := redisstock.New(rdb)
	if err := st.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	const saleID, itemID = 7, 70
	if err := st.Load(ctx, saleID, map[int64]int64{itemID: 5}); err != nil {
		t.Fatal(err)
	}
	m, err := rdb.(*redis.ClusterClient).MasterForKey(ctx, lua.StockKey(saleID))
	if err != nil {
		t.Fatal(err)
	}
	down := -1
	for i, a := range c.Addrs {
		if a == m.Options().Addr {
			down = i
		}
	}
	if down < 0 {
		t.Fatalf("sale %d's master %s is none of %v", saleID, m.Options().Addr, c.Addrs)
	}
	c.Nodes[down].Stop()

	if err := redisconn.Ping(ctx, rdb); err == nil {
		t.Error("Ping = nil with a master down, want an error (readiness 503)")
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = st.Reserve(rctx, saleID, itemID, 1, "o1", time.Now())
	cancel()
	if err == nil {
		t.Fatal("Reserve succeeded on a stopped master")
	}
	if errors.Is(err, redisstock.ErrSoldOut()) {
		t.Fatalf("Reserve = %v, want an unavailable error, not sold out", err)
	}

	if err := c.Restart(ctx, down); err != nil {
		t.Fatal(err)
	}
	// The client finds the node again (its slot map is unchanged).
	testenv.Eventually(t, "Ping to succeed after the node came back", 20*time.Second, func() bool { return redisconn.Ping(ctx, rdb) == nil })
	rem, err := st.Remaining(ctx, saleID)
	if err != nil {
		t.Fatal(err)
	}
	if rem[itemID] != 5 {
		t.Fatalf("remaining after the outage = %d, want 5 (nothing reserved)", rem[itemID])
	}
	if _, ok, err := st.Buyer(ctx, saleID, 1); err != nil || ok {
		t.Fatalf("buyer record after the refused reservation: %v, %v; want none", ok, err)
	}
	if err := st.Reserve(ctx, saleID, itemID, 1, "o1", time.Now()); err != nil {
		t.Fatalf("Reserve after the node came back = %v", err)
	}
}
