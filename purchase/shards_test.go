package purchase

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/sales"
	"github.com/flashsale/flashsale/sales/salestest"
)

// newShardedEnv is newEnv with the sale's stock split over shards.
func newShardedEnv(t testing.TB, shards int, quantities ...int64) *env {
	t.Helper()
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	st := redisstock.New(rdb)
	sl := salestest.CreateSharded(t, sales.NewStore(pool, rdb, st, nil), t0, 1999, shards, quantities...)
	return &env{rdb: rdb, pool: pool, st: st, sale: &sl}
}

// usersHomedOn returns n users whose records live on the given shard.
func (e *env) usersHomedOn(n, shard int) []int64 {
	var out []int64
	for u := int64(1); len(out) < n; u++ {
		if e.st.HomeShard(e.sale.ID, u) == shard {
			out = append(out, u)
		}
	}
	return out
}

func (e *env) shardUnits(t testing.TB, shard int, item int64) int64 {
	t.Helper()
	m, err := e.st.ShardRemaining(context.Background(), e.sale.ID, shard)
	if err != nil {
		t.Fatal(err)
	}
	return m[item]
}

// The local sold-out flag of a sharded sale is set only once every shard
// is empty: buyers of a dry home shard still buy the other shards' units,
// and a unit given back to any shard clears the flag.
func TestShardedSoldOutFlag(t *testing.T) {
	e := newShardedEnv(t, 3, 3) // one unit per shard
	ctx := context.Background()
	s := New(Config{SoldOutRecheck: 20 * time.Millisecond}, e.st, &recorder{}, nil, nil)
	item := e.item(0)
	users := e.usersHomedOn(5, 0)
	orders := make([]string, 3)
	for i := range 3 {
		id, err := s.Reserve(ctx, e.sale, item, users[i])
		if err != nil {
			t.Fatalf("buyer %d of 3: %v", i+1, err)
		}
		orders[i] = id
		if s.SoldOut(item.ID) {
			t.Fatalf("flagged after %d of 3 units (home shard dry, others not)", i+1)
		}
	}
	if _, err := s.Reserve(ctx, e.sale, item, users[3]); codeOf(err) != flashsale.CodeSoldOut {
		t.Fatalf("fourth buyer: %v, want SOLD_OUT", err)
	}
	if !s.SoldOut(item.ID) {
		t.Fatal("not flagged once every shard was empty")
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()
	// The third buyer's unit was lent by shard 1 or 2; it goes back there.
	if ok, err := e.st.Release(ctx, e.sale.ID, users[2], item.ID, orders[2]); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	if e.shardUnits(t, 0, item.ID) != 0 {
		t.Fatal("a borrowed unit went back to the home shard")
	}
	testenv.Eventually(t, "the sold-out flag to clear after a unit came back to a shard", 10*time.Second, func() bool { return !s.SoldOut(item.ID) })
	if _, err := s.Reserve(ctx, e.sale, item, users[4]); err != nil {
		t.Errorf("a buyer of the dry home shard after the flag cleared: %v, want a reservation", err)
	}
}
