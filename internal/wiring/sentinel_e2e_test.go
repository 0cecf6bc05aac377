package wiring_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// TestSentinelFailoverMidSale: a stack on Redis through Sentinel (a master,
// a replica, one sentinel) sells half a sale, Sentinel promotes the
// replica, and the sale goes on. The app follows the new master through
// the sentinels, the reconciler sees the new replication ID and rebuilds
// the stock from PostgreSQL and Kafka, nothing is oversold, every 202 ends
// as a live order and the sale sells out.
func TestSentinelFailoverMidSale(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	testenv.SkipOnCluster(t, "it runs its own master, replica and sentinel; the single-node pass covers it")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	master, err := localsvc.StartRedis(ctx, localsvc.RedisOptions{Dir: t.TempDir()})
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Stop() })
	replica, err := localsvc.StartRedis(ctx, localsvc.RedisOptions{Dir: t.TempDir(), ReplicaOf: master.Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replica.Stop() })
	waitFor(t, "the replica in sync", func() bool {
		info, err := redisInfo(ctx, replica.Addr, "replication")
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	sent, err := localsvc.StartSentinel(ctx, localsvc.SentinelOptions{Dir: t.TempDir(), MasterName: "fs", MasterAddr: master.Addr})
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sent.Stop)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sent.Addr})
	defer sc.Close()
	// Sentinel learns the replica from the master's INFO; a failover needs it.
	waitFor(t, "the sentinel to see the replica", func() bool {
		rs, err := sc.Replicas(ctx, "fs").Result()
		return err == nil && len(rs) == 1
	})

	s := startStack(t, func(c *wiring.Config) {
		c.RedisURL, c.RedisCluster = "", nil
		c.RedisSentinels, c.RedisMaster = []string{sent.Addr}, "fs"
	})
	const quantity, shoppers = 10, 20
	saleID, items := s.createSale(quantity)
	item := items[0]
	tokens := map[int64]string{}
	for u := int64(1000); u < 1000+shoppers; u++ {
		tokens[u] = s.admit(u, saleID)
	}

	accepted := map[string]int64{} // order id → user, every 202 and every order an ALREADY_PURCHASED names
	soldOut := 0
	buy := func(u int64) {
		t.Helper()
		var r apptest.Resp
		testenv.EventuallyF(t, func() string {
			return fmt.Sprintf("user %d's purchase to be answered other than 503 (last %s)", u, r.Raw)
		}, 60*time.Second, func() bool {
			r = s.purchase(u, item, tokens[u])
			switch {
			case r.Status == 202:
				accepted[r.Body["orderId"].(string)] = u
			case r.Status == 410 && r.Body["error"] == "SOLD_OUT":
				soldOut++
			case r.Status == 409 && r.Body["error"] == "ALREADY_PURCHASED":
				// An earlier 503 that carried an order id: it was kept.
				accepted[r.Body["orderId"].(string)] = u
			case r.Status == 503:
				// Redis switching masters, or the stock being rebuilt.
				return false
			default:
				t.Fatalf("user %d: purchase = %d %s", u, r.Status, r.Raw)
			}
			return true
		})
	}
	for u := int64(1000); u < 1000+quantity/2; u++ {
		buy(u)
	}
	if len(accepted) != quantity/2 {
		t.Fatalf("before the failover %d accepted, want %d", len(accepted), quantity/2)
	}

	if err := sc.Failover(ctx, "fs").Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	waitFor(t, "the sentinel to promote the replica", func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, "fs").Result()
		return err == nil && len(addr) == 2 && addr[0]+":"+addr[1] == replica.Addr
	})

	for u := int64(1000) + quantity/2; u < 1000+shoppers; u++ {
		buy(u)
	}
	if len(accepted) != quantity || soldOut != shoppers-quantity {
		t.Fatalf("accepted %d, sold out %d; want %d and %d", len(accepted), soldOut, quantity, shoppers-quantity)
	}
	for id, u := range accepted {
		o := s.waitPayable(u, id)
		if o.Body["status"] != "PENDING" {
			t.Errorf("order %s: %s, want PENDING", id, o.Raw)
		}
	}
	// Writes taken by the old master between the promotion and its
	// demotion are gone from Redis (they are in Kafka and PostgreSQL):
	// the reconciler, seeing the new replication ID, rebuilds the stock,
	// and Redis agrees with the database again.
	var sold, rem int64
	testenv.EventuallyF(t, func() string {
		return fmt.Sprintf("sold=%d remaining=0 after the sale (now %d and %d)", quantity, sold, rem)
	}, 60*time.Second, func() bool {
		fig := s.figures(saleID)
		sold, rem = itemFigure(t, fig, item, "sold"), itemFigure(t, fig, item, "remaining")
		if sold > quantity {
			t.Fatalf("sold %d of %d: oversold", sold, quantity)
		}
		return sold == quantity && rem == 0
	})
	// Nothing more is sold once the stock is rebuilt.
	last := int64(1000 + shoppers - 1) // a shopper who found it sold out
	if r := s.purchase(last, item, tokens[last]); r.Status != 410 {
		t.Fatalf("purchase after the sell-out = %d %s, want 410 SOLD_OUT", r.Status, r.Raw)
	}
	// The writes went to the promoted replica, through the sentinels.
	info, err := redisInfo(ctx, replica.Addr, "replication")
	if err != nil || !strings.Contains(info, "role:master") {
		t.Fatalf("promoted replica: %v %q", err, info)
	}
	// The reconciler saw the new replication ID and rebuilt the stock.
	if n := metricValue(t, s.App.AdminURL, "flashsale_purchase_reconciler_rebuilt_items_total"); n < 1 {
		t.Errorf("rebuilt items = %v, want ≥ 1 after the failover", n)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, 60*time.Second, cond)
}

func redisInfo(ctx context.Context, addr, section string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	return c.Info(ctx, section).Result()
}

func metricValue(t *testing.T, adminURL, name string) float64 {
	t.Helper()
	r, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return 0
}
