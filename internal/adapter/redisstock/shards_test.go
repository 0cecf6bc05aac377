package redisstock

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
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

// newShardedStore loads a sale whose stock is split over shards.
func newShardedStore(t testing.TB, saleID int64, shards int, stock map[int64]int64) (*Store, redis.UniversalClient) {
	t.Helper()
	rdb := testenv.Redis(t)
	st := New(rdb)
	st.SetShards(saleID, shards)
	if err := st.Load(context.Background(), saleID, stock); err != nil {
		t.Fatal(err)
	}
	return st, rdb
}

// shardStock reads one shard's units of an item (-1: no record).
func shardStock(t *testing.T, st *Store, rdb redis.UniversalClient, saleID int64, shard int, itemID int64) int64 {
	t.Helper()
	v, err := rdb.HGet(context.Background(), st.layout(saleID).key(shard, lua.KindStock), strconv.FormatInt(itemID, 10)).Int64()
	if errors.Is(err, redis.Nil) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// usersHomedOn returns n user ids (from first up) whose home shard is shard.
func usersHomedOn(first int64, n, shard, shards int) []int64 {
	var out []int64
	for u := first; len(out) < n; u++ {
		if lua.HomeShard(u, shards) == shard {
			out = append(out, u)
		}
	}
	return out
}

// The shards of a sale sit on distinct cluster slots, one in the middle
// half of each of S equal arcs of the slot ring, as redis-server computes
// slots (CLUSTER KEYSLOT answers without cluster mode).
func TestShardSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := clusterNode(t)
	// Redis Cluster's own examples (cluster specification).
	for key, want := range map[string]int{"123456789": 0x31c3, "somekey": 11058, "foo{hash_tag}": 2515, "bar{hash_tag}": 2515} {
		if got := lua.KeySlot(key); got != want {
			t.Errorf("KeySlot(%q) = %d, want %d", key, got, want)
		}
	}
	for _, shards := range []int{2, 3, 16} {
		for sale := int64(1); sale <= 40; sale++ {
			slot0 := -1
			seen := map[int]bool{}
			for sh := range shards {
				key := lua.ShardKey(lua.ShardTag(sale, sh, shards), lua.KindStock)
				want, err := rdb.ClusterKeySlot(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				got := lua.KeySlot(key)
				if int64(got) != want {
					t.Fatalf("KeySlot(%q) = %d, redis says %d", key, got, want)
				}
				for _, kind := range []string{lua.KindBuyers, lua.KindPending, lua.KindReserved, lua.KindPlaced, lua.KindLoans, lua.KindClaims, lua.KindReturning} {
					if s := lua.KeySlot(lua.ShardKey(lua.ShardTag(sale, sh, shards), kind)); s != got {
						t.Fatalf("sale %d shard %d: %s on slot %d, stock on %d", sale, sh, kind, s, got)
					}
				}
				if seen[got] {
					t.Fatalf("sale %d, %d shards: two shards on slot %d", sale, shards, got)
				}
				seen[got] = true
				if sh == 0 {
					slot0 = got
					if key != lua.StockKey(sale) {
						t.Fatalf("shard 0 key %q, want the sale's own %q", key, lua.StockKey(sale))
					}
					continue
				}
				want0 := slot0 * shards / lua.Slots
				if arc := got * shards / lua.Slots; arc != (want0+sh)%shards {
					t.Errorf("sale %d shard %d of %d: slot %d in arc %d, want %d (shard 0 on %d)", sale, sh, shards, got, arc, (want0+sh)%shards, slot0)
				}
				lo, hi := (got*shards/lua.Slots)*lua.Slots/shards, (got*shards/lua.Slots+1)*lua.Slots/shards
				if q := (hi - lo) / 4; got < lo+q || got >= hi-q {
					t.Errorf("sale %d shard %d of %d: slot %d near an edge of its arc [%d, %d)", sale, sh, shards, got, lo, hi)
				}
			}
		}
	}
}

// clusterNode starts a redis-server in cluster mode (no slots assigned:
// it answers CLUSTER KEYSLOT, which a server without cluster support
// refuses) on ephemeral ports, stopped when the test ends.
func clusterNode(t *testing.T) redis.UniversalClient {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server on PATH")
	}
	port := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	p, bus := port(), port()
	dir := t.TempDir()
	cmd := exec.Command(bin, "--port", strconv.Itoa(p), "--cluster-port", strconv.Itoa(bus), "--bind", "127.0.0.1",
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--dir", dir,
		"--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(p)})
	t.Cleanup(func() { _ = rdb.Close() })
	testenv.Eventually(t, "the cluster-mode redis-server to answer", 30*time.Second, func() bool {
		return rdb.Ping(context.Background()).Err() == nil
	})
	return rdb
}

// For S = 3 the home shard spreads users evenly, consecutive ids as well
// as spaced ones.
func TestHomeShardSpread(t *testing.T) {
	t.Parallel()
	const users, shards = 30000, 3
	for _, step := range []int64{1, 3, 1000} {
		var count [shards]int
		for i := range int64(users) {
			count[lua.HomeShard(1+i*step, shards)]++
		}
		for sh, n := range count {
			if n < users/shards*95/100 || n > users/shards*105/100 {
				t.Errorf("step %d: shard %d has %d of %d users, want %d ± 5%%", step, sh, n, users, users/shards)
			}
		}
	}
	if lua.HomeShard(42, 1) != 0 {
		t.Error("one shard: home is not 0")
	}
}

// With one shard every key is the sale's own, as before shards existed.
func TestOneShardKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, rdb := newShardedStore(t, 5, 1, map[int64]int64{1001: 3})
	if err := st.Reserve(ctx, 5, 1001, 7, "o-1", t0); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordPlaced(ctx, []Placement{{SaleID: 5, UserID: 7, OrderID: "o-1", Partition: 1, Offset: 2}}); err != nil {
		t.Fatal(err)
	}
	keys := testenv.Keys(t, rdb, "*")
	slices.Sort(keys)
	want := []string{lua.BuyersKey(5), lua.PendingKey(5), lua.PlacedKey(5), lua.ReservedKey(5), lua.StockKey(5)}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("keys %v, want %v", keys, want)
	}
	if st.Shards(5) != 1 {
		t.Errorf("Shards = %d, want 1", st.Shards(5))
	}
}

func TestShardedLoadSplits(t *testing.T) {
	t.Parallel()
	st, rdb := newShardedStore(t, 6, 3, map[int64]int64{1001: 10, 1002: 2})
	for item, want := range map[int64][]int64{1001: {4, 3, 3}, 1002: {1, 1, 0}} {
		for sh, w := range want {
			if got := shardStock(t, st, rdb, 6, sh, item); got != w {
				t.Errorf("item %d shard %d: %d units, want %d", item, sh, got, w)
			}
		}
	}
	if got := remaining(t, st, 6, 1001); got != 10 {
		t.Errorf("Remaining = %d, want 10", got)
	}
	left, err := st.ItemsRemaining(context.Background(), 6, []int64{1002, 1001, 999})
	if err != nil || !slices.Equal(left, []int64{2, 10, -1}) {
		t.Errorf("ItemsRemaining = %v %v, want [2 10 -1]", left, err)
	}
}

// The contention test across shards: users skewed onto one home shard
// (or all on it), every unit sold, nobody twice, and no SOLD_OUT answered
// while any shard had a unit (no unit is ever given back in this test, so
// a refusal with a unit left would show as a unit left at the end).
func TestShardedContention(t *testing.T) {
	t.Parallel()
	const shards = 3
	for _, tc := range []struct {
		name      string
		units     int64
		onShard0  int // users homed on shard 0
		elsewhere int // users homed on the others
		pipelined bool
	}{
		{"skewed", 60, 200, 20, false},
		{"skewed pipelined", 60, 200, 20, true},
		{"all on one home, one unit each", 90, 90, 0, false},
		{"all on one home pipelined", 90, 90, 0, true},
		{"fewer users than units", 90, 30, 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			const sale, item = 21, 1001
			st, rdb := newShardedStore(t, sale, shards, map[int64]int64{item: tc.units})
			if tc.pipelined {
				runPipeline(t, st)
			}
			users := usersHomedOn(1, tc.onShard0, 0, shards)
			for sh := 1; sh < shards; sh++ {
				users = append(users, usersHomedOn(1, tc.elsewhere/(shards-1), sh, shards)...)
			}
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				winners  = map[int64]string{}
				refused  atomic.Int64
				failures = make(chan error, len(users))
				start    = make(chan struct{})
			)
			for _, u := range users {
				wg.Go(func() {
					id := uuid.NewString()
					<-start
					err := st.Reserve(ctx, sale, item, u, id, t0)
					switch code(err) {
					case "":
						mu.Lock()
						winners[u] = id
						mu.Unlock()
					case flashsale.CodeSoldOut:
						refused.Add(1)
					default:
						failures <- err
					}
				})
			}
			close(start)
			wg.Wait()
			close(failures)
			for err := range failures {
				t.Fatalf("unexpected answer: %v", err)
			}
			wantSold := min(tc.units, int64(len(users)))
			if got := int64(len(winners)); got != wantSold {
				t.Errorf("reserved %d, want %d", got, wantSold)
			}
			if got := refused.Load(); got != int64(len(users))-wantSold {
				t.Errorf("SOLD_OUT answers %d, want %d", got, int64(len(users))-wantSold)
			}
			if got := remaining(t, st, sale, item); got != tc.units-wantSold {
				t.Errorf("remaining %d, want %d", got, tc.units-wantSold)
			}
			if n, _ := st.BuyerCount(ctx, sale); n != wantSold {
				t.Errorf("buyer records %d, want %d", n, wantSold)
			}
			if n := int64(pendingCount(t, st, sale)); n != wantSold {
				t.Errorf("pending reservations %d, want %d", n, wantSold)
			}
			var loans, claims int64
			for sh := range shards {
				loans += rdb.HLen(ctx, st.layout(sale).key(sh, lua.KindLoans)).Val()
				claims += rdb.ZCard(ctx, st.layout(sale).key(sh, lua.KindClaims)).Val()
			}
			if claims != 0 {
				t.Errorf("%d claims left", claims)
			}
			// Shard 0 holds a third of the units; its other buyers borrowed.
			borrowed := max(0, min(int64(tc.onShard0), wantSold)-shardShare(tc.units, shards, 0))
			if tc.elsewhere == 0 && loans != borrowed {
				t.Errorf("%d loans, want %d", loans, borrowed)
			}
			for u, id := range winners {
				err := st.Reserve(ctx, sale, item, u, uuid.NewString(), t0)
				var fe *flashsale.Error
				if !errors.As(err, &fe) || fe.Code != flashsale.CodeAlreadyPurchased || fe.OrderID != id {
					t.Fatalf("winner %d tries again: %v, want ALREADY_PURCHASED with order %s", u, err, id)
				}
				b, ok, err := st.Buyer(ctx, sale, u)
				if err != nil || !ok || b.OrderID != id || b.ItemID != item {
					t.Fatalf("Buyer(%d) = %+v %v %v, want order %s", u, b, ok, err, id)
				}
			}
		})
	}
}

func shardShare(units int64, shards, shard int) int64 { return split(units, shards, shard) }

// One user sending many purchases at once while the home shard is dry
// gets exactly one unit, and the others' units stay.
func TestShardedOneUserAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const sale, item, shards = 22, 1001, 3
	st, _ := newShardedStore(t, sale, shards, map[int64]int64{item: 2}) // shard 2 has none
	user := usersHomedOn(1, 1, 2, shards)[0]
	var wg sync.WaitGroup
	var ok atomic.Int64
	for range 30 {
		wg.Go(func() {
			err := st.Reserve(ctx, sale, item, user, uuid.NewString(), t0)
			switch code(err) {
			case "":
				ok.Add(1)
			case flashsale.CodeAlreadyPurchased, flashsale.CodeUnavailable:
			default:
				t.Errorf("unexpected answer %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 1 {
		t.Errorf("%d reservations for one user, want 1", ok.Load())
	}
	if got := remaining(t, st, sale, item); got != 1 {
		t.Errorf("remaining %d, want 1", got)
	}
}

// A release gives the unit back to the shard it came from, once.
func TestShardedRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const sale, item, shards = 23, 1001, 3
	st, rdb := newShardedStore(t, sale, shards, map[int64]int64{item: 4}) // 2, 1, 1
	home0 := usersHomedOn(1, 3, 0, shards)
	home2 := usersHomedOn(1, 2, 2, shards)

	// a, b take shard 0's units, c shard 2's; d finds shard 2 and then
	// shard 0 dry and borrows shard 1's.
	a, b, c, d := home0[0], home0[1], home2[0], home2[1]
	for _, u := range []int64{a, b, c, d} {
		if err := st.Reserve(ctx, sale, item, u, "o-"+strconv.FormatInt(u, 10), t0); err != nil {
			t.Fatalf("reserve %d: %v", u, err)
		}
	}
	for sh, want := range []int64{0, 0, 0} {
		if got := shardStock(t, st, rdb, sale, sh, item); got != want {
			t.Fatalf("after four reservations shard %d has %d, want %d", sh, got, want)
		}
	}
	if err := st.Reserve(ctx, sale, item, home0[2], "o-x", t0); code(err) != flashsale.CodeSoldOut {
		t.Fatalf("fifth buyer: %v, want SOLD_OUT", err)
	}
	if got := rdb.HGet(ctx, st.layout(sale).key(1, lua.KindLoans), "o-"+strconv.FormatInt(d, 10)).Val(); got == "" {
		t.Fatalf("no loan of shard 1 to d's order")
	}

	release := func(u int64) bool {
		t.Helper()
		ok, err := st.Release(ctx, sale, u, item, "o-"+strconv.FormatInt(u, 10))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !release(d) {
		t.Fatal("release of the borrowed unit: not given back")
	}
	if got := shardStock(t, st, rdb, sale, 1, item); got != 1 {
		t.Errorf("shard 1 (the donor) has %d after the release, want 1", got)
	}
	if got := shardStock(t, st, rdb, sale, 2, item); got != 0 {
		t.Errorf("shard 2 (the home) has %d after the release, want 0", got)
	}
	if release(d) {
		t.Error("second release gave the unit back again")
	}
	if !release(a) || shardStock(t, st, rdb, sale, 0, item) != 1 {
		t.Errorf("release of a home unit did not go back to shard 0")
	}
	if got := remaining(t, st, sale, item); got != 2 {
		t.Errorf("remaining %d, want 2", got)
	}
	if n := pendingCount(t, st, sale); n != 2 {
		t.Errorf("%d pending, want 2 (b and c)", n)
	}
	for sh := range shards {
		if n := rdb.HLen(ctx, st.layout(sale).key(sh, lua.KindReturning)).Val(); n != 0 {
			t.Errorf("shard %d: %d returns left", sh, n)
		}
	}
}

// A release stopped between the home shard and the donor is finished by
// the next Release of the order, or by Sweep.
func TestShardedReleaseInterrupted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const sale, item, shards = 24, 1001, 2
	for _, finish := range []string{"release", "sweep"} {
		t.Run(finish, func(t *testing.T) {
			t.Parallel()
			st, rdb := newShardedStore(t, sale, shards, map[int64]int64{item: 1}) // shard 0 only
			u := usersHomedOn(1, 1, 1, shards)[0]
			if err := st.Reserve(ctx, sale, item, u, "o-1", t0); err != nil {
				t.Fatal(err)
			}
			l := st.layout(sale)
			// the home step alone, as a process stopped after it would leave it
			res, err := st.scripts().release.Run(ctx, rdb, []string{l.key(1, lua.KindStock), l.key(1, lua.KindBuyers),
				l.key(1, lua.KindPending), l.key(1, lua.KindReturning)}, u, "o-1", item).Slice()
			if err != nil || res[0].(int64) != lua.ResultOwed {
				t.Fatalf("home step: %v %v, want owed", res, err)
			}
			if got := remaining(t, st, sale, item); got != 0 {
				t.Fatalf("remaining %d before the return, want 0", got)
			}
			var back bool
			switch finish {
			case "release":
				back, err = st.Release(ctx, sale, u, item, "o-1")
			case "sweep":
				var n int
				n, err = st.Sweep(ctx, sale, t0)
				back = n == 1
			}
			if err != nil || !back {
				t.Fatalf("%s: back %v, %v; want the unit back", finish, back, err)
			}
			if got := shardStock(t, st, rdb, sale, 0, item); got != 1 {
				t.Errorf("donor has %d, want 1", got)
			}
			if ok, err := st.Release(ctx, sale, u, item, "o-1"); ok || err != nil {
				t.Errorf("release again: %v %v, want false", ok, err)
			}
			if n, err := st.Sweep(ctx, sale, t0.Add(time.Hour)); n != 0 || err != nil {
				t.Errorf("sweep again: %d %v, want 0", n, err)
			}
			if got := remaining(t, st, sale, item); got != 1 {
				t.Errorf("remaining %d, want 1", got)
			}
		})
	}
}

// A reservation stopped between its claim and its settle leaves a claim
// (and maybe a loan): Sweep abandons claims older than its bound, gives
// the loan back, and a late settle of the abandoned claim fails.
func TestShardedClaimSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const sale, item, shards = 25, 1001, 2
	st, rdb := newShardedStore(t, sale, shards, map[int64]int64{item: 1}) // shard 0 only
	l := st.layout(sale)
	sc := st.scripts()
	users := usersHomedOn(1, 2, 1, shards)
	u, other := users[0], users[1]
	ms := t0.UnixMilli()
	// claim on the home shard and take on the donor; the settle never came
	res, err := sc.reserve.Run(ctx, rdb, []string{l.key(1, lua.KindStock), l.key(1, lua.KindBuyers), l.key(1, lua.KindPending),
		l.key(1, lua.KindReserved), l.key(1, lua.KindClaims)}, item, u, "o-1", ms).Slice()
	if err != nil || res[0].(int64) != lua.ResultClaimed {
		t.Fatalf("claim: %v %v", res, err)
	}
	if n, err := sc.take.Run(ctx, rdb, []string{l.key(0, lua.KindStock), l.key(0, lua.KindLoans)}, item, "o-1", u, ms).Int64(); err != nil || n != 0 {
		t.Fatalf("take: %d %v", n, err)
	}
	// the user's purchase is in flight; another user finds the sale dry
	if err := st.Reserve(ctx, sale, item, u, "o-2", t0); code(err) != flashsale.CodeUnavailable {
		t.Errorf("the claimer again: %v, want UNAVAILABLE", err)
	}
	if err := st.Reserve(ctx, sale, item, other, "o-3", t0); code(err) != flashsale.CodeSoldOut {
		t.Errorf("another user: %v, want SOLD_OUT while the unit is taken", err)
	}
	if _, ok, _ := st.Buyer(ctx, sale, u); ok {
		t.Error("a claim reads as a buyer")
	}
	if ok, err := st.Release(ctx, sale, u, item, "o-1"); ok || err != nil {
		t.Errorf("Release of a claim: %v %v, want false (the sweep settles it)", ok, err)
	}
	// claims younger than the bound stay
	if n, err := st.Sweep(ctx, sale, t0); n != 0 || err != nil {
		t.Fatalf("sweep before the bound: %d %v", n, err)
	}
	if n, err := st.Sweep(ctx, sale, t0.Add(time.Second)); n != 1 || err != nil {
		t.Fatalf("sweep: %d %v, want the unit back", n, err)
	}
	if got := shardStock(t, st, rdb, sale, 0, item); got != 1 {
		t.Errorf("donor has %d, want 1", got)
	}
	if n, err := sc.settle.Run(ctx, rdb, []string{l.key(1, lua.KindBuyers), l.key(1, lua.KindPending), l.key(1, lua.KindReserved),
		l.key(1, lua.KindClaims)}, u, "o-1", item, ms, 0).Int64(); err != nil || n != 1 {
		t.Errorf("late settle: %d %v, want refused", n, err)
	}
	if err := st.Reserve(ctx, sale, item, u, "o-4", t0); err != nil {
		t.Fatalf("the user after the sweep: %v", err)
	}
	if got := remaining(t, st, sale, item); got != 0 {
		t.Errorf("remaining %d, want 0", got)
	}
}

func TestShardedPendingAndConfirm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const sale, item, shards = 26, 1001, 3
	st, _ := newShardedStore(t, sale, shards, map[int64]int64{item: 30})
	var ps []Pending
	for sh := range shards {
		u := usersHomedOn(1, 1, sh, shards)[0]
		id := "o-" + strconv.Itoa(sh)
		at := t0.Add(time.Duration(shards-sh) * time.Second)
		if err := st.Reserve(ctx, sale, item, u, id, at); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, Pending{SaleID: sale, OrderID: id, UserID: u, ItemID: item, ReservedAt: at})
		if err := st.RecordPlaced(ctx, []Placement{{SaleID: sale, UserID: u, OrderID: id, Partition: int32(sh), Offset: 7}}); err != nil {
			t.Fatal(err)
		}
		got, err := st.PendingBeforeFrom(ctx, sale, sh, t0.Add(time.Hour), 0, 10)
		if err != nil || len(got) != 1 || got[0].OrderID != id || !got[0].Placed || got[0].Partition != int32(sh) {
			t.Fatalf("shard %d pending: %+v %v", sh, got, err)
		}
	}
	all, err := st.PendingBefore(ctx, sale, t0.Add(time.Hour), 0)
	if err != nil || len(all) != shards || all[0].OrderID != "o-2" || all[2].OrderID != "o-0" {
		t.Fatalf("PendingBefore = %+v %v, want the three oldest first", all, err)
	}
	if err := st.Confirm(ctx, ps); err != nil {
		t.Fatal(err)
	}
	if n := pendingCount(t, st, sale); n != 0 {
		t.Errorf("%d pending after Confirm, want 0", n)
	}
}

// After a loss, Drop empties every shard and Restore rebuilds the split
// stock and each buyer on its home shard.
func TestShardedDropAndRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const sale, item, shards = 27, 1001, 3
	st, rdb := newShardedStore(t, sale, shards, map[int64]int64{item: 3})
	users := usersHomedOn(1, 2, 0, shards) // the second borrows
	for _, u := range users {
		if err := st.Reserve(ctx, sale, item, u, "o-"+strconv.FormatInt(u, 10), t0); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Drop(ctx, sale); err != nil {
		t.Fatal(err)
	}
	if left, err := st.ItemsRemaining(ctx, sale, []int64{item}); err != nil || left[0] != -1 {
		t.Fatalf("after Drop: %v %v, want -1", left, err)
	}
	if err := st.Reserve(ctx, sale, item, 999, "o-999", t0); code(err) != flashsale.CodeNotFound {
		t.Fatalf("reserve after Drop: %v, want NOT_FOUND", err)
	}
	for sh := range shards {
		for _, k := range []string{lua.KindLoans, lua.KindClaims, lua.KindBuyers} {
			if n := rdb.Exists(ctx, st.layout(sale).key(sh, k)).Val(); n != 0 {
				t.Errorf("shard %d %s left after Drop", sh, k)
			}
		}
	}
	buyers := map[int64]Buyer{}
	for _, u := range users {
		buyers[u] = Buyer{OrderID: "o-" + strconv.FormatInt(u, 10), ItemID: item, CreatedAt: t0}
	}
	n, err := st.Restore(ctx, sale, map[int64]int64{item: 1}, buyers)
	if err != nil || n != 1 {
		t.Fatalf("Restore = %d %v, want 1 item", n, err)
	}
	for sh, want := range []int64{1, 0, 0} {
		if got := shardStock(t, st, rdb, sale, sh, item); got != want {
			t.Errorf("shard %d has %d, want %d", sh, got, want)
		}
	}
	for _, u := range users {
		if b, ok, err := st.Buyer(ctx, sale, u); err != nil || !ok || b.OrderID != buyers[u].OrderID || b.ItemID != item || !b.CreatedAt.Equal(t0) {
			t.Errorf("Buyer(%d) = %+v %v %v", u, b, ok, err)
		}
	}
	// the counter outlives Drop (2 reservations) and counts the 2 restored
	if got := rdb.Get(ctx, st.layout(sale).key(0, lua.KindReserved)).Val(); got != "4" {
		t.Errorf("shard 0 reservation counter %q, want 4", got)
	}
	// a restored reservation's unit is its home shard's
	if ok, err := st.Release(ctx, sale, users[1], item, "o-"+strconv.FormatInt(users[1], 10)); !ok || err != nil {
		t.Fatalf("release after restore: %v %v", ok, err)
	}
	if got := shardStock(t, st, rdb, sale, 0, item); got != 2 {
		t.Errorf("shard 0 has %d after the release, want 2", got)
	}
}
