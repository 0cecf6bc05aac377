package orders_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/sales"
	"github.com/flashsale/flashsale/sales/salestest"
)

// A cancel on a sharded sale gives the unit back to the shard it came
// from, and an order not yet in PostgreSQL is read from its user's home
// shard, borrowed unit or not.
func TestShardedCancelAndRedisRead(t *testing.T) {
	ctx := context.Background()
	f := &fixture{pool: testenv.Postgres(t), rdb: testenv.Redis(t)}
	f.stock = redisstock.New(f.rdb)
	store := sales.NewStore(f.pool, f.rdb, f.stock, func() time.Time { return t0 })
	f.sale = salestest.CreateSharded(t, store, t0.Add(-time.Hour), 1000, 2, 2) // one unit per shard
	f.cache = sales.NewCache(store, f.rdb, time.Hour, slog.New(slog.DiscardHandler))
	if err := f.cache.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	f.svc = f.service(f.stock, func() time.Time { return t0 })
	item := f.sale.Items[0].ID
	var users []int64
	for u := int64(1); len(users) < 3; u++ {
		if f.stock.HomeShard(f.sale.ID, u) == 0 {
			users = append(users, u)
		}
	}
	shardUnits := func(sh int) int64 {
		t.Helper()
		m, err := f.stock.ShardRemaining(ctx, f.sale.ID, sh)
		if err != nil {
			t.Fatal(err)
		}
		return m[item]
	}

	f.place(t, users[0], item, t0.Add(-time.Minute), flashsale.OrderPending) // shard 0's unit
	borrowed := f.place(t, users[1], item, t0.Add(-time.Minute), flashsale.OrderPending)
	if shardUnits(0) != 0 || shardUnits(1) != 0 {
		t.Fatalf("units %d, %d after two orders, want 0, 0", shardUnits(0), shardUnits(1))
	}
	if o, err := f.svc.Cancel(ctx, users[1], borrowed); err != nil || o.Status != flashsale.OrderCancelled {
		t.Fatalf("cancel = %+v, %v", o, err)
	}
	if shardUnits(0) != 0 || shardUnits(1) != 1 {
		t.Errorf("units %d, %d after the cancel, want 0, 1 (back to the donor)", shardUnits(0), shardUnits(1))
	}
	if n := f.outbox(t); n != 0 {
		t.Errorf("%d outbox rows left", n)
	}

	// Reserved in Redis only, on a unit of shard 1: read from shard 0.
	id := f.reserve(t, users[2], item, t0)
	o, err := f.svc.BySale(ctx, users[2], f.sale.ID)
	if err != nil || o.ID != id || o.Status != flashsale.OrderPending || o.Payable {
		t.Errorf("BySale = %+v, %v; want order %s PENDING, not payable", o, err, id)
	}
}
