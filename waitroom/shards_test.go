package waitroom

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// usersOnShards returns n user ids, from 1 up, whose home shard in a sale
// of shards shards is one of homes, in id order.
func usersOnShards(t *testing.T, shards, n int, homes ...int) []int64 {
	t.Helper()
	var out []int64
	for u := int64(1); len(out) < n; u++ {
		h := lua.HomeShard(u, shards)
		for _, want := range homes {
			if h == want {
				out = append(out, u)
				break
			}
		}
	}
	return out
}

// buyOnHome stands in for a purchase in a sharded sale: one unit less,
// then the buyer record and the reservation counter on the user's home
// shard. The reserve script does all three at once; a room tick between
// them must not see a reservation with its unit still in stock (a free
// place under a cap of units that are gone), so the unit goes first.
func (e *env) buyOnHome(sale *flashsale.Sale, user int64) {
	e.t.Helper()
	ctx := context.Background()
	home := lua.HomeShard(user, sale.Shards())
	item := sale.Items[0].ID
	e.stock.mu.Lock()
	e.stock.m[sale.ID][item]--
	e.stock.mu.Unlock()
	if err := e.rdb.HSet(ctx, shardKey(sale, home, lua.KindBuyers), user,
		lua.BuyerValue("order-"+strconv.FormatInt(user, 10), item, 1)).Err(); err != nil {
		e.t.Fatal(err)
	}
	if err := e.rdb.Incr(ctx, shardKey(sale, home, lua.KindReserved)).Err(); err != nil {
		e.t.Fatal(err)
	}
}

// TestShardedSaleSellsOut: a sale with 3 stock shards whose shoppers buy
// mostly on shards 1 and 2. The capacity cap counts every shard's
// reservations, so each admitted shopper who bought frees its place and
// the queue keeps admitting until the stock is gone, well within the
// admission TTL (a cap that saw shard 0 only would hold the bought places
// as unused and stall with stock left).
func TestShardedSaleSellsOut(t *testing.T) {
	e := newEnv(t)
	const stock = 6
	s := newSale(t, 71, e.clock.Now().Add(-time.Second), 2, stock)
	s.StockShards = 3
	sale := e.addSale(s)
	g := e.newGateway(Config{AdmissionTTL: time.Hour, CapacityFactor: 1}, nil)
	ctx := context.Background()
	// Five of the six buyers have their home on shard 1 or 2, one on 0;
	// then shoppers who wait in vain.
	users := append(usersOnShards(t, 3, 5, 1, 2), usersOnShards(t, 3, 1, 0)...)
	users = append(users, usersOnShards(t, 3, 10, 1, 2)[5:]...)
	for _, u := range users {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil); err != nil {
			t.Fatal(err)
		}
	}
	admitted := func() int64 {
		f, err := g.room.Figures(ctx, sale.ID)
		if err != nil {
			t.Fatal(err)
		}
		return f.Admitted
	}
	// Every step the rate admits up to 2 shoppers; each admitted shopper
	// buys. Places are tickets (the sale opened before the first join).
	sold := 0
	for step := 0; sold < stock; step++ {
		if step > stock {
			t.Fatalf("%d sold after %d steps, want all %d", sold, step, stock)
		}
		e.clock.Advance(time.Second)
		eventually(t, "the queue admits while stock is left ("+strconv.Itoa(stock-sold)+" units)", 5*time.Second,
			func() bool { return admitted() > int64(sold) })
		for n := admitted(); int64(sold) < n && sold < stock; sold++ {
			e.buyOnHome(sale, users[sold])
		}
	}
	// Sold out: nobody else is admitted.
	e.clock.Advance(time.Second)
	g.waitTicks(t, 3)
	if got := admitted(); got != stock {
		t.Fatalf("admitted %d with %d units, all bought, want %d", got, stock, stock)
	}
}

// TestShardedBuyerKeepsAdmission: in a sale with 3 stock shards, an
// admitted shopper who bought on its home shard 2 keeps ADMITTED when its
// admission expires (it is not put back in the queue), and one who did
// not buy goes to the back of the queue.
func TestShardedBuyerKeepsAdmission(t *testing.T) {
	e := newEnv(t)
	s := newSale(t, 72, e.clock.Now().Add(-time.Millisecond), 2, 100)
	s.StockShards = 3
	sale := e.addSale(s)
	g := e.newGateway(Config{AdmissionTTL: 10 * time.Second}, nil)
	ctx := context.Background()
	buyer, idle := usersOnShards(t, 3, 1, 2)[0], usersOnShards(t, 3, 1, 1)[0]
	for _, u := range []int64{buyer, idle} {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Second) // rate 2/s: both admitted
	for _, u := range []int64{buyer, idle} {
		eventually(t, "admitted", 5*time.Second, func() bool {
			st, err := g.room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
			return err == nil && st.State == StateAdmitted
		})
	}
	e.buyOnHome(sale, buyer)
	// Nobody is admitted any more; the admissions expire.
	s2 := *sale
	s2.AdmissionRatePerSecond = 0
	e.sales.put(&s2)
	e.clock.Advance(10 * time.Second)
	g.waitTicks(t, 3)

	st, err := g.room.Status(ctx, flashsale.Principal{UserID: buyer}, sale.ID)
	if err != nil || st.State != StateAdmitted {
		t.Errorf("buyer on shard 2 after its admission expired: %+v, %v; want ADMITTED", st, err)
	}
	st, err = g.room.Status(ctx, flashsale.Principal{UserID: idle}, sale.ID)
	if err != nil || st.State != StateWaiting || st.AdmissionToken != "" {
		t.Errorf("idle shopper after its admission expired: %+v, %v; want WAITING without a token", st, err)
	}
}

// TestShardBuyers: buyers asks each user's home shard; with one shard it
// asks the sale's buyers hash, and skipHome0 leaves shard 0's users out.
func TestShardBuyers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	one := newSale(t, 73, e.clock.Now(), 1, 10)
	three := newSale(t, 74, e.clock.Now(), 1, 10)
	three.StockShards = 3
	e.addSale(one)
	e.addSale(three)
	on := func(home int) int64 { return usersOnShards(t, 3, 1, home)[0] }
	users := []int64{on(0), on(1), on(2), usersOnShards(t, 3, 2, 2)[1]}
	for _, sale := range []*flashsale.Sale{one, three} {
		for _, u := range users[:3] {
			e.buyOnHome(sale, u)
		}
	}
	cases := []struct {
		name      string
		sale      *flashsale.Sale
		skipHome0 bool
		want      []bool
	}{
		{"one shard", one, false, []bool{true, true, true, false}},
		{"one shard, shard 0 skipped", one, true, []bool{false, false, false, false}},
		{"three shards", three, false, []bool{true, true, true, false}},
		{"three shards, shard 0 skipped", three, true, []bool{false, true, true, false}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := buyers(ctx, e.rdb, c.sale, users, c.skipHome0)
			if err != nil {
				t.Fatal(err)
			}
			for i := range users {
				if got[i] != c.want[i] {
					t.Errorf("user %d (home %d): got %v, want %v", users[i], lua.HomeShard(users[i], c.sale.Shards()), got[i], c.want[i])
				}
			}
		})
	}
	if n, err := otherReserved(ctx, e.rdb, three); err != nil || n != 2 {
		t.Errorf("otherReserved of 3 shards: %d, %v; want 2", n, err)
	}
	if n, err := otherReserved(ctx, e.rdb, one); err != nil || n != 0 {
		t.Errorf("otherReserved of 1 shard: %d, %v; want 0", n, err)
	}
}

// TestShardedRestoreCountsEveryShard: a restore of a sale with 3 stock
// shards counts an admitted connection that bought on shard 2 as a buyer,
// not against the cap, and snapshots the reservation counter of every
// shard for the bucket, as the tick reads it.
func TestShardedRestoreCountsEveryShard(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := newSale(t, 75, e.clock.Now().Add(-time.Minute), 10, 100)
	s.StockShards = 3
	sale := e.addSale(s)
	buyer, idle := usersOnShards(t, 3, 1, 2)[0], usersOnShards(t, 3, 1, 1)[0]
	e.buyOnHome(sale, buyer)
	if err := e.rdb.IncrBy(ctx, shardKey(sale, 1, lua.KindReserved), 4).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.IncrBy(ctx, shardKey(sale, 0, lua.KindReserved), 2).Err(); err != nil {
		t.Fatal(err)
	}
	now := e.clock.Now().UnixMilli()
	at := now - 1000
	in := restoreInput{nowMs: now, ttlMs: time.Minute.Milliseconds(), epoch: "e1",
		st:    queueState{Seq: 2, N: 0, Serving: 2},
		conns: []heldConn{{user: buyer, ticket: 0, place: 0, admittedAt: at}, {user: idle, ticket: 1, place: 1, admittedAt: at}}}
	if err := restoreShardArgs(ctx, e.rdb, sale, &in); err != nil {
		t.Fatal(err)
	}
	if _, _, err := restoreQueue(ctx, e.rdb, sale.ID, in); err != nil {
		t.Fatal(err)
	}
	b, err := e.rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyBuckets)).Result()
	if err != nil {
		t.Fatal(err)
	}
	kb := strconv.FormatInt(at/bucketMs, 10)
	if got, want := b["a"+kb], "1"; got != want {
		t.Errorf("admissions counted against the cap: %q, want %q (the buyer on shard 2 is not)", got, want)
	}
	if got, want := b["r"+kb], "7"; got != want {
		t.Errorf("reservation snapshot: %q, want %q (every shard's counter)", got, want)
	}
}

// TestShardedBuyerNotCountedGone: in a sale with 3 stock shards, an
// admitted shopper who bought on shard 2 and then went away is not
// counted gone (the reservation counter counts its place), while one who
// went away without buying is.
func TestShardedBuyerNotCountedGone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := newSale(t, 76, e.clock.Now().Add(-time.Millisecond), 2, 100)
	s.StockShards = 3
	sale := e.addSale(s)
	g := e.newGateway(Config{AdmissionTTL: time.Hour, AdmittedGrace: 2 * time.Second}, nil)
	buyer, idle := usersOnShards(t, 3, 1, 2)[0], usersOnShards(t, 3, 1, 1)[0]
	for _, u := range []int64{buyer, idle} {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Second) // rate 2/s: both admitted
	for _, u := range []int64{buyer, idle} {
		eventually(t, "admitted", 5*time.Second, func() bool {
			st, err := g.room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
			return err == nil && st.State == StateAdmitted
		})
	}
	e.buyOnHome(sale, buyer)
	// Both stop polling: after the grace period their presence lapses.
	e.clock.Advance(3 * time.Second)
	gone := lua.QueueKey(sale.ID, keyGone)
	eventually(t, "the idle shopper counted gone", 5*time.Second, func() bool {
		ok, err := e.rdb.HExists(ctx, gone, strconv.FormatInt(idle, 10)).Result()
		return err == nil && ok
	})
	g.waitTicks(t, 3)
	if ok, err := e.rdb.HExists(ctx, gone, strconv.FormatInt(buyer, 10)).Result(); err != nil || ok {
		t.Errorf("buyer on shard 2 counted gone: %v, %v; want not", ok, err)
	}
}
