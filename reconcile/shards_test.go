package reconcile

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// The reconciler looks at every shard's pending reservations, and a lost
// one whose unit was borrowed gives it back to its donor.
func TestShardedReconcilerReturnsLostReservation(t *testing.T) {
	t.Parallel()
	e := newShardedEnv(t, 3, 3)
	ctx := context.Background()
	clk := newClock(t0)
	item := e.item(0)
	home2 := e.usersHomedOn(2, 2)
	ids := []string{uuid.NewString(), uuid.NewString()}
	for i, u := range home2 { // the second borrows shard 0's unit
		if err := e.st.Reserve(ctx, e.sale.ID, item.ID, u, ids[i], t0); err != nil {
			t.Fatal(err)
		}
	}
	if e.shardUnits(t, 0, item.ID) != 0 || e.shardUnits(t, 2, item.ID) != 0 {
		t.Fatal("the reservations did not take shard 2's and shard 0's units")
	}
	r := New(Config{Now: clk.now, PaymentWindow: 10 * time.Minute}, e.pool, e.st, e, nil, nil)
	clk.add(3 * time.Minute)
	if n, err := r.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v; want 2 units back", n, err)
	}
	for sh := range 3 {
		if got := e.shardUnits(t, sh, item.ID); got != 1 {
			t.Errorf("shard %d has %d units, want 1", sh, got)
		}
	}
	if n := e.pending(t); n != 0 {
		t.Errorf("%d pending left", n)
	}
	for _, id := range ids {
		assertOrder(t, e.pool, id, flashsale.OrderRejected)
	}
}

// A node that loses some shards of a sale: the reconciler drops the
// others too, so the sale stands still, and rebuilds every shard from the
// database's exact count.
func TestShardedRebuildAfterPartialLoss(t *testing.T) {
	t.Parallel()
	e := newShardedEnv(t, 3, 9) // 3 units per shard
	ctx := context.Background()
	item := e.item(0)
	live := map[int64]string{}
	for _, u := range e.usersHomedOn(3, 0) { // shard 0's units
		id := uuid.NewString()
		if err := e.st.Reserve(ctx, e.sale.ID, item.ID, u, id, t0); err != nil {
			t.Fatal(err)
		}
		insertOrder(t, e, id, item.ID, u, flashsale.OrderPending)
		live[u] = id
	}
	// shard 1's keys are lost
	keys := testenv.Keys(t, e.rdb, "fs:{s"+strconv.FormatInt(e.sale.ID, 10)+".1*")
	if len(keys) == 0 {
		t.Fatal("shard 1 has no keys")
	}
	if err := e.rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	clk := newClock(t0)
	r := New(Config{Now: clk.now}, e.pool, e.st, e, nil, nil)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// The whole sale answers "no stock record" until the rebuild.
	for sh := range 3 {
		if got, err := e.st.ShardRemaining(ctx, e.sale.ID, sh); err != nil || len(got) != 0 {
			t.Errorf("shard %d before the rebuild: %v %v, want no record", sh, got, err)
		}
	}
	if err := e.st.Reserve(ctx, e.sale.ID, item.ID, e.usersHomedOn(1, 2)[0], uuid.NewString(), t0); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Errorf("Reserve before the rebuild: %v, want NOT_FOUND", err)
	}
	clk.add(redisstock.DefaultPublishTimeout)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.remaining(t, item); got != 6 {
		t.Errorf("remaining %d after the rebuild, want 6 (9 - 3 live)", got)
	}
	for sh := range 3 {
		if got := e.shardUnits(t, sh, item.ID); got != 2 {
			t.Errorf("shard %d has %d units, want 2", sh, got)
		}
	}
	for u, id := range live {
		if b, ok := e.buyer(t, u); !ok || b.OrderID != id {
			t.Errorf("user %d buyer %+v %v, want order %s", u, b, ok, id)
		}
		if err := e.st.Reserve(ctx, e.sale.ID, item.ID, u, uuid.NewString(), t0); flashsale.ErrorCode(err) != flashsale.CodeAlreadyPurchased {
			t.Errorf("live buyer %d buys again: %v, want ALREADY_PURCHASED", u, err)
		}
	}
}
