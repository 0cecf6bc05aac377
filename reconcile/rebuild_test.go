package reconcile

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"

	"github.com/flashsale/flashsale"
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

// A loss is timed from its first sighting; a sale seen whole again is
// forgotten, so a later loss waits its own bound.
func TestNoteLoss(t *testing.T) {
	t.Parallel()
	r := newReconciler(newEnv(t, 1), Config{})
	const sale = 7
	for _, step := range []struct {
		name      string
		at        time.Time
		lost      bool
		wantSeen  time.Time
		wantFirst bool
	}{
		{"records there", t0, false, time.Time{}, false},
		{"first sighting", t0.Add(time.Second), true, t0.Add(time.Second), true},
		{"still lost", t0.Add(3 * time.Second), true, t0.Add(time.Second), false},
		{"rebuilt", t0.Add(4 * time.Second), false, time.Time{}, false},
		{"lost again", t0.Add(5 * time.Second), true, t0.Add(5 * time.Second), true},
	} {
		seen, first := r.noteLoss(sale, step.at, step.lost)
		if !seen.Equal(step.wantSeen) || first != step.wantFirst {
			t.Errorf("%s: noteLoss = %v, %v; want %v, %v", step.name, seen, first, step.wantSeen, step.wantFirst)
		}
	}
	if _, first := r.noteLoss(sale+1, t0, true); !first {
		t.Error("another sale's loss is not its own first sighting")
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

	t.Run("sharded: a failed drop forgets the loss", func(t *testing.T) {
		t.Parallel()
		e := newShardedEnv(t, 3, 9)
		e.st.SetShards(e.sale.ID, e.sale.Shards())
		r := newReconciler(e, Config{})
		r.noteLoss(e.sale.ID, t0, true)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := r.dropShards(cctx, e.sale, map[int64]bool{e.item(0).ID: true}); err == nil {
			t.Fatal("dropShards with a cancelled context = nil, want an error")
		}
		if _, first := r.noteLoss(e.sale.ID, t0.Add(time.Second), true); !first {
			t.Error("the loss is still remembered after a failed drop; want it seen first again, so the drop is retried")
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

	if got, err := newReconciler(e, Config{}).inflightOrders(ctx, e.sale); err != nil || got != nil {
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
	got, err := newReconciler(e, Config{Orders: newOrderLog(t, k)}).inflightOrders(ctx, e.sale)
	if err != nil {
		t.Fatal(err)
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
	if got, err := newReconciler(e, Config{Orders: newOrderLog(t, k)}).inflightOrders(ctx, e.sale); err != nil || len(got) != 0 {
		t.Errorf("with every record consumed = %v, %v; want none", got, err)
	}
}

func TestCountRebuild(t *testing.T) {
	t.Parallel()
	live := func(id string, item, user int64) orderstore.LiveOrder {
		return orderstore.LiveOrder{ID: id, ItemID: item, UserID: user, CreatedAt: t0}
	}
	placed := func(id string, item, user int64) flashsale.OrderPlaced {
		return flashsale.OrderPlaced{OrderID: id, ItemID: item, UserID: user, CreatedAtMs: t0.Add(time.Second).UnixMilli()}
	}
	for _, tc := range []struct {
		name          string
		snap          orderstore.Snapshot
		inflight      []flashsale.OrderPlaced
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
			inflight:      []flashsale.OrderPlaced{placed("k1", 1, 21)},
			missing:       []int64{1},
			wantRemaining: map[int64]int64{1: 8},
			wantBuyers:    map[int64]string{11: "o1", 21: "k1"},
			wantFromKafka: 1,
		},
		{
			name:          "an order in flight with a row already does not count twice",
			snap:          orderstore.Snapshot{Quantity: map[int64]int64{1: 10}, Live: []orderstore.LiveOrder{live("k1", 1, 21)}, Stored: map[string]bool{"k1": true, "k2": true}},
			inflight:      []flashsale.OrderPlaced{placed("k1", 1, 21), placed("k2", 1, 22)},
			missing:       []int64{1},
			wantRemaining: map[int64]int64{1: 9},
			wantBuyers:    map[int64]string{21: "k1"},
		},
		{
			name:          "an order in flight of a user with a live order is refused",
			snap:          orderstore.Snapshot{Quantity: map[int64]int64{1: 10}, Live: []orderstore.LiveOrder{live("o1", 1, 11)}},
			inflight:      []flashsale.OrderPlaced{placed("k1", 1, 11)},
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
