package redisstock

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// TestRoomReads: what the waiting room asks of the stock, after real
// reservations. BuyerRecords asks each user's home shard (the sale's
// buyers hash with one shard), BoughtElsewhere leaves shard 0's buyers
// out, and OtherReserved sums the counters of shards 1..S-1. The reader
// is a Store never told the sale's shards: the sale says how many.
func TestRoomReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const item = 1001
	on := func(home int) int64 { return usersHomedOn(1, 1, home, 3)[0] }
	// Homes 0, 1, 2 buy; a second user of home 2 does not.
	users := []int64{on(0), on(1), on(2), usersHomedOn(1, 2, 2, 3)[1]}
	buy := func(t *testing.T, st *Store, saleID int64) {
		t.Helper()
		for _, u := range users[:3] {
			if err := st.Reserve(ctx, saleID, item, u, "order-"+strconv.FormatInt(u, 10), t0); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name          string
		shards        int
		records       []bool
		elsewhere     []int64
		otherReserved int64
	}{
		{"one shard", 1, []bool{true, true, true, false}, nil, 0},
		{"three shards", 3, []bool{true, true, true, false}, []int64{users[1], users[2]}, 2},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sale := &flashsale.Sale{ID: int64(80 + i), StockShards: c.shards}
			st, rdb := newShardedStore(t, sale.ID, c.shards, map[int64]int64{item: 30})
			buy(t, st, sale.ID)
			reader := New(rdb)
			got, err := reader.BuyerRecords(ctx, sale, users)
			if err != nil {
				t.Fatal(err)
			}
			for j, u := range users {
				if got[j] != c.records[j] {
					t.Errorf("BuyerRecords, user %d (home %d): got %v, want %v", u, lua.HomeShard(u, sale.Shards()), got[j], c.records[j])
				}
			}
			elsewhere, err := reader.BoughtElsewhere(ctx, sale, users)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(elsewhere, c.elsewhere) {
				t.Errorf("BoughtElsewhere: got %v, want %v", elsewhere, c.elsewhere)
			}
			n, err := reader.OtherReserved(ctx, sale)
			if err != nil {
				t.Fatal(err)
			}
			if n != c.otherReserved {
				t.Errorf("OtherReserved: got %d, want %d", n, c.otherReserved)
			}
			if got, err := reader.BuyerRecords(ctx, sale, nil); err != nil || len(got) != 0 {
				t.Errorf("BuyerRecords of no users: %v, %v; want none", got, err)
			}
		})
	}
}

// TestOtherReservedOnlyGrows: a release gives the unit back but leaves
// the reservation counters as they were, so a sum read before a script
// is never more than the sum when it runs (OtherReserved's rule).
func TestOtherReservedOnlyGrows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const item = 1001
	sale := &flashsale.Sale{ID: 90, StockShards: 3}
	st, _ := newShardedStore(t, sale.ID, 3, map[int64]int64{item: 30})
	u := usersHomedOn(1, 1, 1, 3)[0]
	if err := st.Reserve(ctx, sale.ID, item, u, "order-1", t0); err != nil {
		t.Fatal(err)
	}
	before, err := st.OtherReserved(ctx, sale)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Release(ctx, sale.ID, u, item, "order-1"); err != nil {
		t.Fatal(err)
	}
	after, err := st.OtherReserved(ctx, sale)
	if err != nil {
		t.Fatal(err)
	}
	if before != 1 || after != before {
		t.Errorf("OtherReserved before and after a release: %d, %d; want 1, 1", before, after)
	}
}
