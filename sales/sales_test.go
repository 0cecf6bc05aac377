package sales

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestCreateGetUpdateFigures(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	st := redisstock.New(rdb)
	s := NewStore(testenv.Postgres(t), rdb, st, nil)
	starts := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	in := flashsale.Sale{Name: "Winter drop", StartsAt: starts, AdmissionRatePerSecond: 2000, CreatedBy: "1",
		Items: []flashsale.Item{{ProductID: 501, Quantity: 10, PriceCents: 1999}, {ProductID: 502, Quantity: 3, PriceCents: 500}}}
	out, err := s.Create(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(out.ShuffleSeed)
	if len(out.ShuffleSeed) != 32 || out.ShuffleCommitment != hex.EncodeToString(sum[:]) {
		t.Fatalf("commitment %s is not sha256 of the 32-byte seed %x", out.ShuffleCommitment, out.ShuffleSeed)
	}
	if out.ID == 0 || len(out.Items) != 2 || out.Items[0].ID < 1001 || out.Items[0].SaleID != out.ID {
		t.Fatalf("ids not assigned: %+v", out)
	}
	got, err := s.Get(ctx, out.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != in.Name || !got.StartsAt.Equal(starts) || got.ShuffleCommitment != out.ShuffleCommitment || len(got.Items) != 2 {
		t.Fatalf("Get = %+v, want what was created", got)
	}
	// Without an allocation: queue order, the default window.
	if got.Allocation != flashsale.AllocationQueue || got.ClaimWindow != flashsale.DefaultClaimWindow {
		t.Fatalf("allocation %q, window %v; want queue, %v", got.Allocation, got.ClaimWindow, flashsale.DefaultClaimWindow)
	}
	raced := in
	raced.Allocation, raced.ClaimWindow = flashsale.AllocationRace, 45*time.Second
	q, err := s.Create(ctx, raced)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, q.ID); err != nil || got.Allocation != flashsale.AllocationRace || got.ClaimWindow != 45*time.Second {
		t.Fatalf("Get = %q %v, %v; want race order with a 45 s window", got.Allocation, got.ClaimWindow, err)
	}
	rem, err := st.Remaining(ctx, out.ID)
	if err != nil || rem[out.Items[0].ID] != 10 || rem[out.Items[1].ID] != 3 {
		t.Fatalf("stock in Redis = %v (%v), want 10 and 3", rem, err)
	}
	rate := 50
	upd, err := s.Update(ctx, out.ID, flashsale.SaleUpdate{Actor: "2", AdmissionRatePerSecond: &rate})
	if err != nil || upd.AdmissionRatePerSecond != 50 || upd.Name != in.Name {
		t.Fatalf("Update = %+v, %v", upd, err)
	}
	if _, err := s.Update(ctx, 999999, flashsale.SaleUpdate{AdmissionRatePerSecond: &rate}); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Fatalf("update of an unknown sale: %v, want NOT_FOUND", err)
	}
	if _, err := s.Get(ctx, 999999); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Fatalf("get of an unknown sale: %v, want NOT_FOUND", err)
	}
	if err := st.Reserve(ctx, out.ID, out.Items[1].ID, 7, "8d3f8a4e-4f0b-4c43-9a57-4d7f3f0c2b11", time.Now()); err != nil {
		t.Fatal(err)
	}
	figs, err := s.Figures(ctx, out.ID)
	if err != nil || len(figs) != 2 || figs[1].Remaining != 2 || figs[0].Remaining != 10 {
		t.Fatalf("figures %+v, %v", figs, err)
	}
}

// A sharded sale keeps its shard count, tells every stock store that reads
// it, and its figures count the units of every shard.
func TestShardedSale(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	s := NewStore(pool, rdb, redisstock.New(rdb), nil)
	in := flashsale.Sale{Name: "Hot drop", StartsAt: time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC), AdmissionRatePerSecond: 10,
		StockShards: 3, Items: []flashsale.Item{{ProductID: 501, Quantity: 10, PriceCents: 1}}}
	out, err := s.Create(ctx, in)
	if err != nil || out.StockShards != 3 {
		t.Fatalf("Create = %+v, %v; want 3 shards", out, err)
	}
	// Another process: its stock store learns the count from the sale store.
	st := redisstock.New(rdb)
	other := NewStore(pool, rdb, st, nil)
	if st.Shards(out.ID) != 1 {
		t.Fatal("a fresh stock store knows the count already")
	}
	list, err := other.List(ctx)
	if err != nil || len(list) != 1 || list[0].StockShards != 3 {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if st.Shards(out.ID) != 3 {
		t.Fatalf("stock store after List: %d shards, want 3", st.Shards(out.ID))
	}
	item := out.Items[0].ID
	for sh, want := range []int64{4, 3, 3} {
		m, err := st.ShardRemaining(ctx, out.ID, sh)
		if err != nil || m[item] != want {
			t.Errorf("shard %d: %v %v, want %d units", sh, m, err, want)
		}
	}
	var users []int64
	for u := int64(1); len(users) < 5; u++ {
		if st.HomeShard(out.ID, u) == 1 {
			users = append(users, u)
		}
	}
	for i, u := range users { // the last two borrow
		if err := st.Reserve(ctx, out.ID, item, u, "order-"+string(rune('a'+i)), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	figs, err := other.Figures(ctx, out.ID)
	if err != nil || len(figs) != 1 || figs[0].Remaining != 5 {
		t.Fatalf("figures %+v, %v; want 5 remaining", figs, err)
	}
	got, err := other.Get(ctx, out.ID)
	if err != nil || got.Shards() != 3 {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	one, err := s.Create(ctx, flashsale.Sale{Name: "n", StartsAt: in.StartsAt, AdmissionRatePerSecond: 1, Items: in.Items})
	if err != nil || one.StockShards != 1 {
		t.Fatalf("default: %+v, %v; want 1 shard", one, err)
	}
}

func TestCache(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := NewStore(testenv.Postgres(t), rdb, redisstock.New(rdb), nil)
	c := NewCache(s, rdb, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, ok := c.Sale(1); ok {
		t.Fatal("empty cache found a sale")
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	sl, err := s.Create(ctx, flashsale.Sale{Name: "x", StartsAt: time.Now(), AdmissionRatePerSecond: 1,
		Items: []flashsale.Item{{ProductID: 1, Quantity: 1, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the cache to pick the new sale up", 5*time.Second, func() bool {
		_, _, ok := c.ItemSale(sl.Items[0].ID)
		return ok
	})
	if got, item, _ := c.ItemSale(sl.Items[0].ID); got.ID != sl.ID || item.Quantity != 1 {
		t.Fatalf("ItemSale = %+v %+v", got, item)
	}
	if len(c.Sales()) != 1 {
		t.Fatalf("Sales() = %d, want 1", len(c.Sales()))
	}
}

// TestCacheReadsItsOwnCreate: a Refresh run after a sale's creation finds
// the sale, however many refreshes run beside it. A refresh that began
// before the creation and ended after the creator's own refresh used to
// put the older snapshot back: the gateway that had just created a sale
// answered 404 for it.
func TestCacheReadsItsOwnCreate(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := NewStore(testenv.Postgres(t), rdb, redisstock.New(rdb), nil)
	c := NewCache(s, rdb, time.Hour, slog.New(slog.DiscardHandler))
	bg, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for bg.Err() == nil {
				_ = c.Refresh(bg)
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	for i := range 100 {
		sl, err := s.Create(ctx, flashsale.Sale{Name: "x", StartsAt: time.Now(), AdmissionRatePerSecond: 1,
			Items: []flashsale.Item{{ProductID: 1, Quantity: 1, PriceCents: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := c.Sale(sl.ID); !ok {
			t.Fatalf("creation %d: sale %d not in the cache after a refresh begun after it", i, sl.ID)
		}
	}
}
