package reconcile

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
)

// The steps of rebuildIfLost (rebuild.go), one test each; the whole
// rebuild is tested in reconciler_test.go and shards_test.go.

func newReconciler(e *env, cfg Config) *Reconciler {
	return New(cfg, e.pool, e.st, e, nil, nil)
}

func TestMissingItems(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		lose func(ctx context.Context, e *env) error
		want []int // indexes of the items missing
	}{
		{"every record there", func(context.Context, *env) error { return nil }, nil},
		{"one item's field gone", func(ctx context.Context, e *env) error {
			return e.rdb.HDel(ctx, lua.StockKey(e.sale.ID), strconv.FormatInt(e.item(1).ID, 10)).Err()
		}, []int{1}},
		{"the stock record gone", func(ctx context.Context, e *env) error {
			return e.rdb.Del(ctx, lua.StockKey(e.sale.ID)).Err()
		}, []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 10, 4)
			ctx := context.Background()
			if err := tc.lose(ctx, e); err != nil {
				t.Fatal(err)
			}
			got, err := newReconciler(e, Config{}).missingItems(ctx, e.sale)
			if err != nil {
				t.Fatal(err)
			}
			want := map[int64]bool{}
			for _, i := range tc.want {
				want[e.item(i).ID] = true
			}
			if !maps.Equal(got, want) {
				t.Errorf("missing = %v, want %v", got, want)
			}
		})
	}
}

// A loss is seen once by one reconciler of the fleet: the first to take
// the sale's rebuild lock, which drops every placement lease; it rebuilds
// one lease TTL after the sighting, fences off what it does not count,
// gives the lock up and forgets the loss, and another reconciler that saw
// the loss meanwhile does nothing.
func TestLossSeenOnceRebuiltAfterOneLeaseTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 10, 4)
	a := e.item(0)
	const ttl = 3 * time.Second
	if _, err := e.st.AcquireLease(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	k := testenv.NewKafka(t)
	commitToEnd(t, k)
	clk := newClock(t0)
	cfg := Config{Now: clk.now, Orders: newOrderLog(t, k), LeaseTTL: ttl}
	r, other := newReconciler(e, cfg), newReconciler(e, cfg)
	if err := e.rdb.Del(ctx, lua.StockKey(e.sale.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.rebuildIfLost(ctx, e.sale); err != nil {
		t.Fatal(err)
	}
	l := r.noteLoss(e.sale.ID, true)
	if l == nil || !l.seen.Equal(t0) {
		t.Fatalf("loss after the first sighting = %+v, want seen at %v", l, t0)
	}
	if n, err := e.rdb.Exists(ctx, lua.LeasesKey, lua.LeaseRenewalsKey).Result(); err != nil || n != 0 {
		t.Errorf("leases after the sighting: %d keys (%v), want dropped", n, err)
	}
	if err := other.rebuildIfLost(ctx, e.sale); err != nil || other.noteLoss(e.sale.ID, true) != nil {
		t.Errorf("a second reconciler while the lock is held: %v, loss %+v; want nothing", err, other.noteLoss(e.sale.ID, true))
	}
	clk.add(ttl - time.Millisecond)
	for _, rc := range []*Reconciler{r, other} {
		if err := rc.rebuildIfLost(ctx, e.sale); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := e.rdb.Exists(ctx, lua.StockKey(e.sale.ID)).Result(); err != nil || n != 0 {
		t.Fatalf("stock rebuilt before one lease TTL (%v)", err)
	}
	clk.add(time.Millisecond)
	if err := r.rebuildIfLost(ctx, e.sale); err != nil {
		t.Fatal(err)
	}
	if got := e.remaining(t, a); got != 10 {
		t.Errorf("remaining %d after the rebuild, want 10", got)
	}
	snap, err := orderstore.New(e.pool).ReadSnapshot(ctx, e.sale.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range e.sale.Items {
		if f := snap.Fences[it.ID]; len(f) != 1 || !f[0].Before.Equal(t0) {
			t.Errorf("item %d fences %+v, want one, before %v", it.ID, f, t0)
		}
	}
	if r.noteLoss(e.sale.ID, true) != nil {
		t.Error("the loss is still remembered after the rebuild")
	}
	if n, err := e.rdb.Exists(ctx, lua.RebuildKey(e.sale.ID)).Result(); err != nil || n != 0 {
		t.Errorf("the rebuild lock is still held after the rebuild (%v)", err)
	}
}

// A loss seen, and the stock whole again without this rebuild: the loss
// is forgotten and the lock given up, so that it does not hold off the
// rebuild of a next loss until it lapses.
func TestLossGoneWithoutRebuildGivesTheLockUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 10)
	r := newReconciler(e, Config{Now: newClock(t0).now, LeaseTTL: 3 * time.Second})
	if err := e.rdb.Del(ctx, lua.StockKey(e.sale.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.rebuildIfLost(ctx, e.sale); err != nil {
		t.Fatal(err)
	}
	if n, err := e.rdb.Exists(ctx, lua.RebuildKey(e.sale.ID)).Result(); err != nil || n != 1 {
		t.Fatalf("rebuild lock after the sighting: %d (%v), want held", n, err)
	}
	if err := e.st.Load(ctx, e.sale.ID, map[int64]int64{e.item(0).ID: 10}); err != nil {
		t.Fatal(err)
	}
	if err := r.rebuildIfLost(ctx, e.sale); err != nil {
		t.Fatal(err)
	}
	if n, err := e.rdb.Exists(ctx, lua.RebuildKey(e.sale.ID)).Result(); err != nil || n != 0 {
		t.Errorf("rebuild lock with the stock whole again: %d (%v), want given up", n, err)
	}
	if l := r.noteLoss(e.sale.ID, true); l != nil {
		t.Errorf("loss %+v still remembered", l)
	}
}

// failingLog fails its first Unconsumed, as a broker that goes away
// between the rebuild's two reads.
type failingLog struct {
	OrderLog
	failed bool
}

func (f *failingLog) Unconsumed(ctx context.Context, committed, end map[int32]int64) ([]kafka.LoggedOrder, error) {
	if !f.failed {
		f.failed = true
		return nil, errors.New("the broker went away")
	}
	return f.OrderLog.Unconsumed(ctx, committed, end)
}

// A rebuild that fails after writing its fence keeps that fence when it
// tries again: one fence per loss, counted up to its offsets.
func TestRebuildTriedAgainKeepsItsFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 10)
	k := testenv.NewKafka(t)
	clk := newClock(t0)
	const ttl = 3 * time.Second
	r := newReconciler(e, Config{Now: clk.now, Orders: &failingLog{OrderLog: newOrderLog(t, k)}, LeaseTTL: ttl})
	if err := e.rdb.Del(ctx, lua.StockKey(e.sale.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.rebuildIfLost(ctx, e.sale); err != nil {
		t.Fatal(err)
	}
	clk.add(ttl)
	if err := r.rebuildIfLost(ctx, e.sale); err == nil {
		t.Fatal("rebuild with the broker away = nil, want its error")
	}
	if err := r.rebuildIfLost(ctx, e.sale); err != nil {
		t.Fatalf("rebuild tried again: %v", err)
	}
	if got := e.remaining(t, e.item(0)); got != 10 {
		t.Errorf("remaining %d after the rebuild, want 10", got)
	}
	snap, err := orderstore.New(e.pool).ReadSnapshot(ctx, e.sale.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f := snap.Fences[e.item(0).ID]; len(f) != 1 {
		t.Errorf("fences %+v, want the one of the first try", f)
	}
}

func TestDropShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("one shard: nothing dropped", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, 10, 4)
		missing := map[int64]bool{e.item(0).ID: true}
		if err := newReconciler(e, Config{}).dropShards(ctx, e.sale, missing); err != nil {
			t.Fatal(err)
		}
		if want := map[int64]bool{e.item(0).ID: true}; !maps.Equal(missing, want) {
			t.Errorf("missing = %v, want %v", missing, want)
		}
		if got := e.remaining(t, e.item(1)); got != 4 {
			t.Errorf("item b remaining %d, want 4 (kept)", got)
		}
	})

	t.Run("sharded: every shard dropped", func(t *testing.T) {
		t.Parallel()
		e := newShardedEnv(t, 3, 9, 6)
		e.st.SetShards(e.sale.ID, e.sale.Shards())
		missing := map[int64]bool{e.item(0).ID: true}
		if err := newReconciler(e, Config{}).dropShards(ctx, e.sale, missing); err != nil {
			t.Fatal(err)
		}
		if want := map[int64]bool{e.item(0).ID: true, e.item(1).ID: true}; !maps.Equal(missing, want) {
			t.Errorf("missing = %v, want every item %v", missing, want)
		}
		for sh := range 3 {
			if got, err := e.st.ShardRemaining(ctx, e.sale.ID, sh); err != nil || len(got) != 0 {
				t.Errorf("shard %d after the drop: %v %v, want no record", sh, got, err)
			}
		}
	})

	t.Run("sharded: a failed drop leaves the loss unseen", func(t *testing.T) {
		t.Parallel()
		e := newShardedEnv(t, 3, 9)
		e.st.SetShards(e.sale.ID, e.sale.Shards())
		r := newReconciler(e, Config{})
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := r.seeLoss(cctx, e.sale, map[int64]bool{e.item(0).ID: true}); err == nil {
			t.Fatal("seeLoss with a cancelled context = nil, want an error")
		}
		if l := r.noteLoss(e.sale.ID, true); l != nil {
			t.Errorf("loss %+v remembered after a failed drop; want it seen first again, so the drop is retried", l)
		}
		if got := e.shardUnits(t, 0, e.item(0).ID); got != 3 {
			t.Errorf("shard 0 has %d units, want its 3 (nothing dropped)", got)
		}
	})
}

// The orders in flight are the sale's records past the writer's committed
// offsets, once each, without those the writer dead-letters.
func TestInflightOrders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 10, 4)
	a, b := e.item(0), e.item(1)

	if got, err := newReconciler(e, Config{}).inflightOrders(ctx, e.sale, nil, nil); err != nil || got != nil {
		t.Fatalf("without an OrderLog = %v, %v; want none", got, err)
	}

	k := testenv.NewKafka(t)
	p := newProducer(t, k, 3*time.Second)
	at := t0.UnixMilli()
	kept := []flashsale.OrderPlaced{
		{OrderID: uuid.NewString(), SaleID: e.sale.ID, ItemID: a.ID, UserID: 1, CreatedAtMs: at},
		{OrderID: uuid.NewString(), SaleID: e.sale.ID, ItemID: b.ID, UserID: 2, CreatedAtMs: at},
	}
	for _, o := range []flashsale.OrderPlaced{
		kept[0],
		kept[1],
		kept[0], // published twice
		{OrderID: uuid.NewString(), SaleID: e.sale.ID + 1000, ItemID: a.ID, UserID: 3, CreatedAtMs: at}, // another sale
		{OrderID: "not-a-uuid", SaleID: e.sale.ID, ItemID: a.ID, UserID: 4, CreatedAtMs: at},            // dead-lettered
		{OrderID: uuid.NewString(), SaleID: e.sale.ID, ItemID: 999999, UserID: 5, CreatedAtMs: at},      // no such item
	} {
		if err := p.Publish(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	log := newOrderLog(t, k)
	committed, end, err := log.Progress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	read, err := newReconciler(e, Config{Orders: log}).inflightOrders(ctx, e.sale, committed, end)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]flashsale.OrderPlaced, len(read))
	for i, o := range read {
		got[i] = o.OrderPlaced
	}
	byID := func(x, y flashsale.OrderPlaced) int {
		if x.OrderID < y.OrderID {
			return -1
		}
		if x.OrderID > y.OrderID {
			return 1
		}
		return 0
	}
	slices.SortFunc(got, byID)
	slices.SortFunc(kept, byID)
	if !slices.Equal(got, kept) {
		t.Errorf("in flight = %+v, want %+v", got, kept)
	}

	commitToEnd(t, k)
	committed, end, err = log.Progress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := newReconciler(e, Config{Orders: log}).inflightOrders(ctx, e.sale, committed, end); err != nil || len(got) != 0 {
		t.Errorf("with every record consumed = %v, %v; want none", got, err)
	}
}

func TestCountRebuild(t *testing.T) {
	t.Parallel()
	live := func(id string, item, user int64) orderstore.LiveOrder {
		return orderstore.LiveOrder{ID: id, ItemID: item, UserID: user, CreatedAt: t0}
	}
	placed := func(id string, item, user int64) kafka.LoggedOrder {
		return kafka.LoggedOrder{OrderPlaced: flashsale.OrderPlaced{OrderID: id, ItemID: item, UserID: user, CreatedAtMs: t0.Add(time.Second).UnixMilli()}, Offset: 5}
	}
	for _, tc := range []struct {
		name          string
		snap          orderstore.Snapshot
		inflight      []kafka.LoggedOrder
		missing       []int64
		wantRemaining map[int64]int64
		wantBuyers    map[int64]string // user → order id
		wantFromKafka int
	}{
		{
			name:          "live orders in the database",
			snap:          orderstore.Snapshot{Quantity: map[int64]int64{1: 10, 2: 4}, Live: []orderstore.LiveOrder{live("o1", 1, 11), live("o2", 1, 12), live("o3", 2, 13)}},
			missing:       []int64{1, 2},
			wantRemaining: map[int64]int64{1: 8, 2: 3},
			wantBuyers:    map[int64]string{11: "o1", 12: "o2", 13: "o3"},
		},
		{
			name:          "an order in flight without a row counts",
			snap:          orderstore.Snapshot{Quantity: map[int64]int64{1: 10}, Live: []orderstore.LiveOrder{live("o1", 1, 11)}},
			inflight:      []kafka.LoggedOrder{placed("k1", 1, 21)},
			missing:       []int64{1},
			wantRemaining: map[int64]int64{1: 8},
			wantBuyers:    map[int64]string{11: "o1", 21: "k1"},
			wantFromKafka: 1,
		},
		{
			name:          "an order in flight with a row already does not count twice",
			snap:          orderstore.Snapshot{Quantity: map[int64]int64{1: 10}, Live: []orderstore.LiveOrder{live("k1", 1, 21)}, Stored: map[string]bool{"k1": true, "k2": true}},
			inflight:      []kafka.LoggedOrder{placed("k1", 1, 21), placed("k2", 1, 22)},
			missing:       []int64{1},
			wantRemaining: map[int64]int64{1: 9},
			wantBuyers:    map[int64]string{21: "k1"},
		},
		{
			name: "an order in flight an earlier rebuild's fence refuses does not count",
			snap: orderstore.Snapshot{Quantity: map[int64]int64{1: 10, 2: 4}, Fences: map[int64][]orderstore.Fence{
				1: {orderstore.NewFence(t0.Add(2*time.Second), map[int32]int64{0: 5})},
				2: {orderstore.NewFence(t0.Add(2*time.Second), map[int32]int64{0: 6})},
			}},
			inflight:      []kafka.LoggedOrder{placed("k1", 1, 21), placed("k2", 2, 22)},
			missing:       []int64{1, 2},
			wantRemaining: map[int64]int64{1: 10, 2: 3},
			wantBuyers:    map[int64]string{22: "k2"},
			wantFromKafka: 1,
		},
		{
			name:          "an order in flight of a user with a live order is refused",
			snap:          orderstore.Snapshot{Quantity: map[int64]int64{1: 10}, Live: []orderstore.LiveOrder{live("o1", 1, 11)}},
			inflight:      []kafka.LoggedOrder{placed("k1", 1, 11)},
			missing:       []int64{1},
			wantRemaining: map[int64]int64{1: 9},
			wantBuyers:    map[int64]string{11: "o1"},
		},
		{
			name:          "only the missing items, and only those the database knows",
			snap:          orderstore.Snapshot{Quantity: map[int64]int64{1: 10, 2: 4}, Live: []orderstore.LiveOrder{live("o1", 2, 11)}},
			missing:       []int64{2, 3},
			wantRemaining: map[int64]int64{2: 3},
			wantBuyers:    map[int64]string{11: "o1"},
		},
		{
			name:          "never below zero",
			snap:          orderstore.Snapshot{Quantity: map[int64]int64{1: 1}, Live: []orderstore.LiveOrder{live("o1", 1, 11), live("o2", 1, 12)}},
			missing:       []int64{1},
			wantRemaining: map[int64]int64{1: 0},
			wantBuyers:    map[int64]string{11: "o1", 12: "o2"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			missing := map[int64]bool{}
			for _, id := range tc.missing {
				missing[id] = true
			}
			got := countRebuild(tc.snap, tc.inflight, missing)
			if !maps.Equal(got.remaining, tc.wantRemaining) {
				t.Errorf("remaining = %v, want %v", got.remaining, tc.wantRemaining)
			}
			buyers := map[int64]string{}
			for u, b := range got.buyers {
				buyers[u] = b.OrderID
			}
			if !maps.Equal(buyers, tc.wantBuyers) {
				t.Errorf("buyers = %v, want %v", buyers, tc.wantBuyers)
			}
			if got.fromKafka != tc.wantFromKafka {
				t.Errorf("fromKafka = %d, want %d", got.fromKafka, tc.wantFromKafka)
			}
		})
	}
}

// restore writes only what Redis lacks and counts the items it set.
func TestRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 10, 4)
	a, b := e.item(0), e.item(1)
	r := newReconciler(e, Config{})
	if err := testenv.Flush(ctx, e.rdb); err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	counts := rebuildCounts{
		remaining: map[int64]int64{a.ID: 7},
		buyers:    map[int64]redisstock.Buyer{5: {OrderID: id, ItemID: a.ID, CreatedAt: t0}},
	}
	if err := r.restore(ctx, e.sale, counts); err != nil {
		t.Fatal(err)
	}
	if got := e.remaining(t, a); got != 7 {
		t.Errorf("item a remaining %d, want 7", got)
	}
	if got, _ := e.st.ItemsRemaining(ctx, e.sale.ID, []int64{b.ID}); got[0] != -1 {
		t.Errorf("item b remaining %d, want no record (not in the counts)", got[0])
	}
	if bu, ok := e.buyer(t, 5); !ok || bu.OrderID != id {
		t.Errorf("user 5's buyer record %+v %v, want order %s", bu, ok, id)
	}
	if got := rebuiltItems(t, r); got != 1 {
		t.Errorf("rebuilt items %v, want 1", got)
	}

	// A second restore, with other counts, changes nothing there.
	counts.remaining[a.ID] = 3
	if err := r.restore(ctx, e.sale, counts); err != nil {
		t.Fatal(err)
	}
	if got := e.remaining(t, a); got != 7 {
		t.Errorf("item a remaining after a second restore %d, want 7 (kept)", got)
	}
	if got := rebuiltItems(t, r); got != 1 {
		t.Errorf("rebuilt items after a second restore %v, want still 1", got)
	}
}

func rebuiltItems(t *testing.T, r *Reconciler) float64 {
	t.Helper()
	var m dto.Metric
	if err := r.rebuilt.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
