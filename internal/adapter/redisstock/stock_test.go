package redisstock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var t0 = time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)

func newStore(t testing.TB, saleID int64, stock map[int64]int64) (*Store, redis.UniversalClient) {
	t.Helper()
	rdb := testenv.Redis(t)
	st := New(rdb)
	if err := st.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := st.Load(context.Background(), saleID, stock); err != nil {
		t.Fatal(err)
	}
	return st, rdb
}

func code(err error) flashsale.Code { return flashsale.ErrorCode(err) }

func remaining(t *testing.T, st *Store, saleID, itemID int64) int64 {
	t.Helper()
	m, err := st.Remaining(context.Background(), saleID)
	if err != nil {
		t.Fatal(err)
	}
	return m[itemID]
}

func pendingCount(t *testing.T, st *Store, saleID int64) int {
	t.Helper()
	p, err := st.PendingBefore(context.Background(), saleID, t0.Add(24*time.Hour), 0)
	if err != nil {
		t.Fatal(err)
	}
	return len(p)
}

// The article's contention test: 1,000 shoppers at once for 100 units,
// each call on its own round trip and in shared pipelines.
func TestReserveContention(t *testing.T) {
	t.Parallel()
	t.Run("direct", func(t *testing.T) {
		t.Parallel()
		st, _ := newStore(t, 1, map[int64]int64{1001: 100})
		contention(t, st, 1, 1001, 100, 1000)
		if n, calls := st.PipelineStats(); n != 0 || calls != 0 {
			t.Errorf("PipelineStats = %d, %d without RunPipeline, want 0, 0", n, calls)
		}
	})
	t.Run("pipelined", func(t *testing.T) {
		t.Parallel()
		st, _ := newStore(t, 11, map[int64]int64{1001: 100})
		stop := runPipeline(t, st)
		contention(t, st, 11, 1001, 100, 1000)
		stop()
		n, calls := st.PipelineStats()
		// every call went through a sender (1,000 shoppers and one retry),
		// and calls shared round trips
		if calls != 1001 || n < 1 || n >= calls {
			t.Errorf("PipelineStats = %d pipelines, %d calls; want 1001 calls in fewer pipelines", n, calls)
		}
	})
}

// pipelineRunning reports whether the pipeline's senders take calls.
func (st *Store) pipelineRunning() bool {
	p := st.pipe.Load()
	return p != nil && p.running.Load()
}

// runPipeline runs st.RunPipeline until the returned stop is called (or
// the test ends); stop waits for it to return.
func runPipeline(t *testing.T, st *Store) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- st.RunPipeline(ctx, 0) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("RunPipeline: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	// wait until the senders take calls
	testenv.Eventually(t, "the pipeline's senders to run", 10*time.Second, st.pipelineRunning)
	return stop
}

func contention(t *testing.T, st *Store, sale, item, units, users int64) {
	t.Helper()
	ctx := context.Background()
	var (
		wg              sync.WaitGroup
		reserved, sold  atomic.Int64
		mu              sync.Mutex
		winners         = map[int64]string{}
		start           = make(chan struct{})
		unexpected      atomic.Value
		unexpectedCount atomic.Int64
	)
	for u := int64(1); u <= users; u++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uuid.NewString()
			<-start
			err := st.Reserve(ctx, sale, item, u, id, t0)
			switch code(err) {
			case "":
				reserved.Add(1)
				mu.Lock()
				winners[u] = id
				mu.Unlock()
			case flashsale.CodeSoldOut:
				sold.Add(1)
			default:
				unexpected.Store(err)
				unexpectedCount.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := unexpectedCount.Load(); n > 0 {
		t.Fatalf("%d unexpected errors, e.g. %v", n, unexpected.Load())
	}
	if got := reserved.Load(); got != units {
		t.Errorf("reserved %d, want exactly %d", got, units)
	}
	if got := sold.Load(); got != users-units {
		t.Errorf("sold out answers %d, want %d", got, users-units)
	}
	if got := remaining(t, st, sale, item); got != 0 {
		t.Errorf("remaining %d, want 0", got)
	}
	if n, _ := st.BuyerCount(ctx, sale); n != units {
		t.Errorf("buyer records %d, want %d", n, units)
	}
	if n := int64(pendingCount(t, st, sale)); n != units {
		t.Errorf("pending reservations %d, want %d", n, units)
	}
	for u, id := range winners {
		err := st.Reserve(ctx, sale, item, u, uuid.NewString(), t0)
		var fe *flashsale.Error
		if !errors.As(err, &fe) || fe.Code != flashsale.CodeAlreadyPurchased || fe.OrderID != id {
			t.Fatalf("winner %d tries again: %v, want ALREADY_PURCHASED with order %s", u, err, id)
		}
		b, ok, err := st.Buyer(ctx, sale, u)
		if err != nil || !ok || b.OrderID != id || b.ItemID != item || !b.CreatedAt.Equal(t0) {
			t.Fatalf("Buyer(%d) = %+v %v %v, want order %s item %d at %v", u, b, ok, err, id, item, t0)
		}
		break
	}
}

func TestReserveOnePerUserPerSale(t *testing.T) {
	t.Parallel()
	const sale, a, b = 2, 1001, 1002
	st, _ := newStore(t, sale, map[int64]int64{a: 5, b: 5})
	ctx := context.Background()
	if err := st.Reserve(ctx, sale, a, 42, "order-a", t0); err != nil {
		t.Fatalf("first purchase: %v", err)
	}
	err := st.Reserve(ctx, sale, b, 42, "order-b", t0)
	var fe *flashsale.Error
	if !errors.As(err, &fe) || fe.Code != flashsale.CodeAlreadyPurchased || fe.OrderID != "order-a" {
		t.Fatalf("second purchase in the same sale, other item: %v, want ALREADY_PURCHASED order-a", err)
	}
	if got := remaining(t, st, sale, b); got != 5 {
		t.Errorf("item b remaining %d, want 5 (untouched)", got)
	}
	// Another sale is another matter.
	if err := st.Load(ctx, 3, map[int64]int64{2001: 1}); err != nil {
		t.Fatal(err)
	}
	if err := st.Reserve(ctx, 3, 2001, 42, "order-c", t0); err != nil {
		t.Errorf("purchase in another sale: %v", err)
	}
}

func TestReserveRefusals(t *testing.T) {
	t.Parallel()
	const sale = 4
	st, _ := newStore(t, sale, map[int64]int64{1001: 0})
	ctx := context.Background()
	tests := []struct {
		name string
		item int64
		want flashsale.Code
	}{
		{"sold out", 1001, flashsale.CodeSoldOut},
		{"unknown item", 9999, flashsale.CodeNotFound},
	}
	for _, tc := range tests {
		if got := code(st.Reserve(ctx, sale, tc.item, 1, "o", t0)); got != tc.want {
			t.Errorf("%s: code %q, want %q", tc.name, got, tc.want)
		}
	}
	if n, _ := st.BuyerCount(ctx, sale); n != 0 {
		t.Errorf("refusals left %d buyer records, want 0", n)
	}
	if !errors.Is(st.Reserve(ctx, sale, 1001, 1, "o", t0), ErrSoldOut()) {
		t.Error("SOLD_OUT is not the shared ErrSoldOut")
	}
}

func TestReleaseOnce(t *testing.T) {
	t.Parallel()
	const sale, item = 5, 1001
	st, _ := newStore(t, sale, map[int64]int64{item: 3})
	ctx := context.Background()
	if err := st.Reserve(ctx, sale, item, 7, "o7", t0); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		got, err := st.Release(ctx, sale, 7, item, "o7")
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("release #%d = %v, want %v", i+1, got, want)
		}
		if r := remaining(t, st, sale, item); r != 3 {
			t.Errorf("after release #%d remaining %d, want 3", i+1, r)
		}
	}
	if _, ok, _ := st.Buyer(ctx, sale, 7); ok {
		t.Error("buyer record left after release")
	}
	if n := pendingCount(t, st, sale); n != 0 {
		t.Errorf("pending %d after release, want 0", n)
	}
	// The user may buy again after the release.
	if err := st.Reserve(ctx, sale, item, 7, "o7b", t0); err != nil {
		t.Errorf("buying again after release: %v", err)
	}
}

func TestReleaseOtherOrderKeepsStock(t *testing.T) {
	t.Parallel()
	const sale, item = 6, 1001
	st, _ := newStore(t, sale, map[int64]int64{item: 3})
	ctx := context.Background()
	if err := st.Reserve(ctx, sale, item, 7, "new", t0); err != nil {
		t.Fatal(err)
	}
	// An old order of the same user (released long ago) comes back.
	got, err := st.Release(ctx, sale, 7, item, "old")
	if err != nil {
		t.Fatal(err)
	}
	if got {
		t.Error("release of another order than the buyer record's = true, want false")
	}
	if r := remaining(t, st, sale, item); r != 2 {
		t.Errorf("remaining %d, want 2", r)
	}
	if b, ok, _ := st.Buyer(ctx, sale, 7); !ok || b.OrderID != "new" {
		t.Errorf("buyer record = %+v %v, want order new", b, ok)
	}
}

// Redis forgets scripts (restart, SCRIPT FLUSH): the calls load them again.
// Not parallel: SCRIPT FLUSH is server-wide.
func TestNoScriptRecovery(t *testing.T) {
	const sale, item = 7, 1001
	st, rdb := newStore(t, sale, map[int64]int64{item: 2})
	ctx := context.Background()
	flush := func() {
		t.Helper()
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	if err := st.Reserve(ctx, sale, item, 1, "o1", t0); err != nil {
		t.Fatalf("Reserve after SCRIPT FLUSH: %v", err)
	}
	flush()
	if ok, err := st.Release(ctx, sale, 1, item, "o1"); err != nil || !ok {
		t.Fatalf("Release after SCRIPT FLUSH = %v, %v; want true", ok, err)
	}
	if r := remaining(t, st, sale, item); r != 2 {
		t.Errorf("remaining %d, want 2", r)
	}
	// in a pipeline: the NOSCRIPT call is sent again with the script
	stop := runPipeline(t, st)
	flush()
	if err := st.Reserve(ctx, sale, item, 2, "o2", t0); err != nil {
		t.Fatalf("pipelined Reserve after SCRIPT FLUSH: %v", err)
	}
	stop()
	if _, calls := st.PipelineStats(); calls != 1 {
		t.Errorf("pipelined calls %d, want 1", calls)
	}
	if r := remaining(t, st, sale, item); r != 1 {
		t.Errorf("remaining %d, want 1", r)
	}
}

// Once RunPipeline returns, Reserve goes straight to Redis again, with the
// same answers; a second RunPipeline on the Store is refused.
func TestPipelineStop(t *testing.T) {
	t.Parallel()
	const sale, item = 12, 1001
	st, _ := newStore(t, sale, map[int64]int64{item: 2})
	ctx := context.Background()
	stop := runPipeline(t, st)
	if err := st.Reserve(ctx, sale, item, 1, "o1", t0); err != nil {
		t.Fatal(err)
	}
	if err := st.Reserve(ctx, sale, item, 1, "o1b", t0); code(err) != flashsale.CodeAlreadyPurchased {
		t.Fatalf("pipelined second Reserve of user 1: %v, want ALREADY_PURCHASED", err)
	}
	stop()
	if err := st.RunPipeline(ctx, 1); err == nil {
		t.Error("second RunPipeline: nil error, want a refusal")
	}
	if err := st.Reserve(ctx, sale, item, 2, "o2", t0); err != nil {
		t.Fatal(err)
	}
	if err := st.Reserve(ctx, sale, item, 3, "o3", t0); code(err) != flashsale.CodeSoldOut {
		t.Fatalf("Reserve of a sold-out item after the pipeline stopped: %v, want SOLD_OUT", err)
	}
	if n, calls := st.PipelineStats(); n != 2 || calls != 2 {
		t.Errorf("PipelineStats = %d, %d; want 2, 2 (the calls after stop went straight to Redis)", n, calls)
	}
}

func TestPendingAndConfirm(t *testing.T) {
	t.Parallel()
	const sale, item = 8, 1001
	st, _ := newStore(t, sale, map[int64]int64{item: 10})
	ctx := context.Background()
	for i, at := range []time.Time{t0, t0.Add(time.Second), t0.Add(2 * time.Second)} {
		if err := st.Reserve(ctx, sale, item, int64(i+1), "o"+string(rune('a'+i)), at); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.PendingBefore(ctx, sale, t0.Add(time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []Pending{{SaleID: sale, OrderID: "oa", UserID: 1, ItemID: item, ReservedAt: t0}}
	if len(got) != 1 || got[0].OrderID != want[0].OrderID || got[0].UserID != 1 || got[0].ItemID != item || !got[0].ReservedAt.Equal(t0) {
		t.Fatalf("PendingBefore(t0+1s) = %+v, want %+v (the bound is exclusive)", got, want)
	}
	if err := st.Confirm(ctx, got); err != nil {
		t.Fatal(err)
	}
	if n := pendingCount(t, st, sale); n != 2 {
		t.Errorf("pending after confirm %d, want 2", n)
	}
	// Confirm keeps the buyer record and the stock as they are.
	if _, ok, _ := st.Buyer(ctx, sale, 1); !ok {
		t.Error("confirm removed the buyer record")
	}
	if r := remaining(t, st, sale, item); r != 7 {
		t.Errorf("remaining %d, want 7", r)
	}
}

func TestItemsRemainingAndRestore(t *testing.T) {
	t.Parallel()
	const sale = 9
	st, rdb := newStore(t, sale, map[int64]int64{1001: 4, 1002: 0})
	ctx := context.Background()
	got, err := st.ItemsRemaining(ctx, sale, []int64{1002, 1001, 1003})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{0, 4, -1}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("ItemsRemaining = %v, want %v", got, want)
	}
	if err := testenv.Flush(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	buyers := map[int64]Buyer{5: {OrderID: "o5", ItemID: 1001, CreatedAt: t0}}
	n, err := st.Restore(ctx, sale, map[int64]int64{1001: 3, 1002: 0}, buyers)
	if err != nil || n != 2 {
		t.Fatalf("Restore = %d, %v; want 2 fields set", n, err)
	}
	if err := st.Reserve(ctx, sale, 1001, 6, "o6", t0); err != nil {
		t.Fatal(err)
	}
	// The restored buyer counts as a reservation (the waiting room's cap
	// takes its admission as used), as does the reservation after it.
	if got, err := rdb.Get(ctx, lua.ReservedKey(sale)).Int64(); err != nil || got != 2 {
		t.Errorf("reservation counter = %d, %v after a restored buyer and a reservation; want 2", got, err)
	}
	// A second restorer with the same (now stale) figures changes nothing.
	n, err = st.Restore(ctx, sale, map[int64]int64{1001: 3, 1002: 0}, buyers)
	if err != nil || n != 0 {
		t.Fatalf("second Restore = %d, %v; want 0 fields set", n, err)
	}
	if got, err := rdb.Get(ctx, lua.ReservedKey(sale)).Int64(); err != nil || got != 2 {
		t.Errorf("reservation counter = %d, %v after a second restore; want 2 (a buyer already there is not counted again)", got, err)
	}
	if r := remaining(t, st, sale, 1001); r != 2 {
		t.Errorf("remaining %d, want 2", r)
	}
	if code(st.Reserve(ctx, sale, 1002, 5, "again", t0)) != flashsale.CodeAlreadyPurchased {
		t.Error("restored buyer could buy again")
	}
	if ok, _ := st.Release(ctx, sale, 5, 1001, "o5"); !ok {
		t.Error("release of a restored order did not give its unit back")
	}
}

// BenchmarkReserveScript drives the reserve script straight at Redis from
// many goroutines, every call a successful reservation of a fresh user: one
// round trip per call.
func BenchmarkReserveScript(b *testing.B) { benchReserve(b, false) }

// BenchmarkReservePipelined is BenchmarkReserveScript with RunPipeline:
// the calls share round trips.
func BenchmarkReservePipelined(b *testing.B) { benchReserve(b, true) }

func benchReserve(b *testing.B, pipelined bool) {
	opt, err := redis.ParseURL(testenv.RedisURL(b))
	if err != nil {
		b.Fatal(err)
	}
	opt.PoolSize = 64
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	st := New(rdb)
	ctx := context.Background()
	if err := st.LoadScripts(ctx); err != nil {
		b.Fatal(err)
	}
	const sale, item = 1, 1001
	if err := st.Load(ctx, sale, map[int64]int64{item: 1 << 40}); err != nil {
		b.Fatal(err)
	}
	if pipelined {
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- st.RunPipeline(pctx, 0) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				b.Error(err)
			}
		}()
		testenv.Eventually(b, "the pipeline's senders to run", 10*time.Second, st.pipelineRunning)
	}
	var user atomic.Int64
	b.SetParallelism(32) // 64 goroutines on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			u := user.Add(1)
			if err := st.Reserve(ctx, sale, item, u, uuid.NewString(), t0); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	if n, calls := st.PipelineStats(); n > 0 {
		b.ReportMetric(float64(calls)/float64(n), "calls/pipeline")
	}
	_ = rdb.Del(ctx, lua.BuyersKey(sale), lua.PendingKey(sale), lua.StockKey(sale))
}

// TestRequireReplicasRefusesUnreplicated: behind Sentinel a reservation no
// replica acknowledged is an error (the caller releases it and answers
// 503), never a success a promotion could lose; without the requirement
// the same Redis reserves.
func TestRequireReplicasRefusesUnreplicated(t *testing.T) {
	ctx := context.Background()
	st, _ := newStore(t, 31, map[int64]int64{310: 2})
	st.RequireReplicas(1, 10*time.Millisecond) // the test's Redis has no replica
	err := st.Reserve(ctx, 31, 310, 1, "o1", t0)
	if !errors.Is(err, errUnreplicated) || code(err) != flashsale.CodeInternal {
		t.Fatalf("Reserve without a replica = %v, want errUnreplicated, no domain error", err)
	}
	if _, err := st.Release(ctx, 31, 1, 310, "o1"); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, st, 31, 310); got != 2 {
		t.Fatalf("remaining after the refused reservation's release = %d, want 2", got)
	}
	st.RequireReplicas(0, 0)
	if err := st.Reserve(ctx, 31, 310, 1, "o2", t0); err != nil {
		t.Fatalf("Reserve without the requirement = %v", err)
	}
}
