package redisstock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale"
)

func newOrderID(t *testing.T) string {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

func wantCode(t *testing.T, what string, err error, code flashsale.Code) {
	t.Helper()
	if got := flashsale.ErrorCode(err); got != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
}

// A hold takes a unit for its user until the window ends: holds never
// exceed the stock, a user holds or buys once, the holder's claim within
// the window turns the hold into a reservation made at the claim (of the
// held item only), and a lapse after the window gives the unit back for
// the next in line, whose claim of the old hold is refused. With shards,
// a hold borrowed from another shard is claimed and lapses the same way,
// and its unit goes back to its lender.
func TestHoldClaimLapse(t *testing.T) {
	t.Parallel()
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			ctx := context.Background()
			sale, item := int64(40+shards), int64(1001)
			st, rdb := newShardedStore(t, sale, shards, map[int64]int64{item: 3, 1002: 5})
			// Users homed on one shard, so with 3 shards two holds borrow.
			users := usersHomedOn(100, 5, 0, max(shards, 1))
			t0 := time.UnixMilli(1_800_000_000_000)
			until := t0.Add(2 * time.Minute)
			orders := map[int64]string{}
			for _, u := range users[:3] {
				orders[u] = newOrderID(t)
				if err := st.Hold(ctx, sale, item, u, orders[u], until); err != nil {
					t.Fatalf("hold for %d: %v", u, err)
				}
			}
			wantCode(t, "a fourth hold of 3 units", st.Hold(ctx, sale, item, users[3], newOrderID(t), until), flashsale.CodeSoldOut)
			err := st.Hold(ctx, sale, 1002, users[0], newOrderID(t), until)
			wantCode(t, "a second hold of one user", err, flashsale.CodeAlreadyPurchased)
			if fe := (*flashsale.Error)(nil); !errors.As(err, &fe) || fe.OrderID != orders[users[0]] {
				t.Fatalf("a second hold names %v, want order %s", err, orders[users[0]])
			}
			if n, err := st.HoldCount(ctx, sale); err != nil || n != 3 {
				t.Fatalf("HoldCount %d, %v; want 3", n, err)
			}

			// The holder claims within the window: the hold's order,
			// reserved at the claim.
			claimAt := t0.Add(30 * time.Second)
			got, end, err := st.Claim(ctx, sale, item, users[0], claimAt)
			if err != nil || got != orders[users[0]] || !end.Equal(until) {
				t.Fatalf("claim: %q, %v, %v; want %s until %v", got, end, err, orders[users[0]], until)
			}
			b, ok, err := st.Buyer(ctx, sale, users[0])
			if err != nil || !ok || b.OrderID != got || !b.CreatedAt.Equal(claimAt) {
				t.Fatalf("buyer after the claim: %+v %v %v, want order %s at %v", b, ok, err, got, claimAt)
			}
			pend, err := st.PendingBefore(ctx, sale, claimAt.Add(time.Millisecond), 100)
			if err != nil || len(pend) != 1 || pend[0].OrderID != got || !pend[0].ReservedAt.Equal(claimAt) {
				t.Fatalf("pending before the claim's end: %+v %v, want the claimed order at %v only", pend, err, claimAt)
			}
			// A claim whose order could not be published is the hold
			// again, once, and is claimed again.
			if ok, err := st.Unclaim(ctx, sale, users[0], got, end); err != nil || !ok {
				t.Fatalf("unclaim: %v, %v", ok, err)
			}
			if ok, err := st.Unclaim(ctx, sale, users[0], got, end); err != nil || ok {
				t.Fatalf("a second unclaim: %v, %v; want nothing to undo", ok, err)
			}
			if n, err := st.HoldCount(ctx, sale); err != nil || n != 3 {
				t.Fatalf("HoldCount after the unclaim %d, %v; want 3", n, err)
			}
			if again, _, err := st.Claim(ctx, sale, item, users[0], claimAt); err != nil || again != got {
				t.Fatalf("claim after the unclaim: %q, %v; want %s", again, err, got)
			}
			_, _, err = st.Claim(ctx, sale, item, users[0], claimAt)
			wantCode(t, "a second claim", err, flashsale.CodeAlreadyPurchased)
			_, _, err = st.Claim(ctx, sale, 1002, users[1], claimAt)
			wantCode(t, "a claim of another item", err, flashsale.CodeInvalid)
			_, _, err = st.Claim(ctx, sale, item, users[4], claimAt)
			wantCode(t, "a claim without a hold", err, flashsale.CodeNotAdmitted)

			// Nothing lapses within the window.
			if l, err := st.Lapse(ctx, sale, until.Add(-time.Millisecond), 0); err != nil || len(l) != 0 {
				t.Fatalf("lapse before the window's end: %+v, %v; want none", l, err)
			}
			_, _, err = st.Claim(ctx, sale, item, users[1], until.Add(time.Millisecond))
			wantCode(t, "a claim after the window", err, flashsale.CodeNotAdmitted)
			lapsed, err := st.Lapse(ctx, sale, until.Add(time.Millisecond), 0)
			if err != nil || len(lapsed) != 2 {
				t.Fatalf("lapse after the window: %+v, %v; want users %v", lapsed, err, users[1:3])
			}
			for _, l := range lapsed {
				if l.ItemID != item || l.OrderID != orders[l.UserID] {
					t.Fatalf("lapsed %+v, want item %d order %s", l, item, orders[l.UserID])
				}
			}
			if rem, err := st.Remaining(ctx, sale); err != nil || rem[item] != 2 {
				t.Fatalf("remaining after the lapse: %v, %v; want 2", rem, err)
			}
			if shards > 1 {
				// Both borrowed units went back to their lenders.
				for sh := 1; sh < shards; sh++ {
					if n := shardStock(t, st, rdb, sale, sh, item); n != 1 {
						t.Fatalf("shard %d has %d units after the lapse, want its 1 back", sh, n)
					}
				}
			}
			_, _, err = st.Claim(ctx, sale, item, users[1], until.Add(time.Millisecond))
			wantCode(t, "a claim after the lapse", err, flashsale.CodeNotAdmitted)
			// The units go to the next in line.
			for _, u := range users[3:5] {
				if err := st.Hold(ctx, sale, item, u, newOrderID(t), until.Add(time.Minute)); err != nil {
					t.Fatalf("hold of a returned unit for %d: %v", u, err)
				}
			}
			// The sale ends: every hold goes.
			if l, err := st.Lapse(ctx, sale, EndOfTime(), 0); err != nil || len(l) != 2 {
				t.Fatalf("lapse at the end: %+v, %v; want 2", l, err)
			}
			if n, err := st.HoldCount(ctx, sale); err != nil || n != 0 {
				t.Fatalf("HoldCount after the end %d, %v; want 0", n, err)
			}
			if rem, err := st.Remaining(ctx, sale); err != nil || rem[item] != 2 {
				t.Fatalf("remaining after the end: %v, %v; want 2 (one unit bought)", rem, err)
			}
		})
	}
}

// At the very instant a window ends both a claim and a lapse may run;
// each hold goes to exactly one of them, and the lapsed units, no more
// and no fewer, are back in stock.
func TestHoldClaimOrLapseNeverBoth(t *testing.T) {
	t.Parallel()
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			ctx := context.Background()
			sale, item := int64(50+shards), int64(1001)
			const n = 200
			st, _ := newShardedStore(t, sale, shards, map[int64]int64{item: n})
			until := time.UnixMilli(1_800_000_000_000)
			for u := int64(1); u <= n; u++ {
				if err := st.Hold(ctx, sale, item, u, newOrderID(t), until); err != nil {
					t.Fatal(err)
				}
			}
			var claimed, lapsed int
			var mu sync.Mutex
			var wg sync.WaitGroup
			// Claims and lapses start together, from a barrier: four
			// claimers from the last user down, four lapsers in the holds
			// set's order (the first users up), so they meet.
			start := make(chan struct{})
			for k := range int64(4) {
				wg.Go(func() {
					<-start
					for u := n - k; u >= 1; u -= 4 {
						_, _, err := st.Claim(ctx, sale, item, u, until)
						if err == nil {
							mu.Lock()
							claimed++
							mu.Unlock()
						} else if flashsale.ErrorCode(err) != flashsale.CodeNotAdmitted {
							t.Errorf("claim of %d: %v", u, err)
						}
					}
				})
			}
			for range 4 {
				wg.Go(func() {
					<-start
					for {
						l, err := st.Lapse(ctx, sale, until, 5)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						lapsed += len(l)
						mu.Unlock()
						// Holds claimed meanwhile are passed over; done
						// once every hold is settled.
						if c, err := st.HoldCount(ctx, sale); err != nil || c == 0 {
							return
						}
					}
				})
			}
			close(start)
			wg.Wait()
			rem, err := st.Remaining(ctx, sale)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d claimed, %d lapsed", claimed, lapsed)
			if claimed+lapsed != n || rem[item] != int64(lapsed) {
				t.Fatalf("%d claimed, %d lapsed, %d back in stock; want %d in all, every lapse back", claimed, lapsed, rem[item], n)
			}
			if c, _ := st.HoldCount(ctx, sale); c != 0 {
				t.Fatalf("%d holds left", c)
			}
		})
	}
}
