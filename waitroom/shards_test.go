package waitroom

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
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

// buyOnHome makes user's purchase in a sharded sale: one unit less in
// the room's stock source, then a reservation by the stock adapter
// (redisstock), which writes the buyer record and counts it on the user's
// home shard, borrowing the unit of another shard when the home one is
// dry. The unit goes first: a room tick between the two must not see a
// reservation with its unit still in stock (a free place under a cap of
// units that are gone).
func (e *env) buyOnHome(sale *flashsale.Sale, user int64) {
	e.t.Helper()
	ctx := context.Background()
	item := sale.Items[0]
	st := redisstock.New(e.rdb)
	st.SetShards(sale.ID, sale.Shards())
	// Redis's copy of the item's units, written where missing only, so
	// that each purchase finds the units the ones before it left.
	if _, err := st.Restore(ctx, sale.ID, map[int64]int64{item.ID: item.Quantity}, nil); err != nil {
		e.t.Fatal(err)
	}
	e.stock.mu.Lock()
	e.stock.m[sale.ID][item.ID]--
	e.stock.mu.Unlock()
	if err := st.Reserve(ctx, sale.ID, item.ID, user, "order-"+strconv.FormatInt(user, 10), e.clock.Now()); err != nil {
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
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
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
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
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
	// Besides the buyer, four purchases on shard 1 and two on shard 0 of
	// shoppers not connected here: seven on the three counters.
	for _, u := range usersOnShards(t, 3, 5, 1)[1:] { // [0] is idle
		e.buyOnHome(sale, u)
	}
	for _, u := range usersOnShards(t, 3, 2, 0) {
		e.buyOnHome(sale, u)
	}
	now := e.clock.Now().UnixMilli()
	at := now - 1000
	in := restoreInput{nowMs: now, ttlMs: time.Minute.Milliseconds(), epoch: "e1",
		st:    queueState{Seq: 2, N: 0, Serving: 2},
		conns: []heldConn{{user: buyer, ticket: 0, place: 0, admittedAt: at}, {user: idle, ticket: 1, place: 1, admittedAt: at}}}
	if err := restoreShardArgs(ctx, redisstock.New(e.rdb), sale, &in); err != nil {
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
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
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
