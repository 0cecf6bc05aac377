package redisstock

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// Leases on Redis's clock: two gateways get two slots; a lease renewed
// stays; one not renewed for its TTL is listed lapsed and can no longer
// be renewed (its gateway learns it lost it) nor taken by another, until
// it is freed, after which it is listed no more.
func TestLeaseLapseAndFree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := New(testenv.Redis(t))
	const ttl = 300 * time.Millisecond
	a, err := st.AcquireLease(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.AcquireLease(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if a.Slot == b.Slot || a.Slot < 1 || b.Slot < 1 || a.Slot > MaxLeaseSlots || a.Token == b.Token {
		t.Fatalf("leases %+v and %+v: want two slots in 1..%d with their own tokens", a, b, MaxLeaseSlots)
	}
	if ok, err := st.RenewLease(ctx, a, ttl); err != nil || !ok {
		t.Fatalf("renew a fresh lease = %v, %v", ok, err)
	}
	if ok, err := st.RenewLease(ctx, Lease{Slot: a.Slot, Token: b.Token}, ttl); err != nil || ok {
		t.Fatalf("renew with another token = %v, %v; want refused", ok, err)
	}
	// b is renewed while a is not.
	testenv.Eventually(t, "lease a lapsed", 10*time.Second, func() bool {
		if ok, err := st.RenewLease(ctx, b, ttl); err != nil || !ok {
			t.Fatalf("renew b = %v, %v", ok, err)
		}
		l, err := st.LapsedLeases(ctx, ttl)
		return err == nil && len(l) == 1 && l[0] == a
	})
	if ok, err := st.RenewLease(ctx, a, ttl); err != nil || ok {
		t.Fatalf("renew a lapsed lease = %v, %v; want refused", ok, err)
	}
	n, err := st.leaseOp(ctx, "acquire", a.Slot, "other", ttl).Int()
	if err != nil || n != 0 {
		t.Fatalf("acquire a lapsed slot not freed = %d, %v; want refused", n, err)
	}
	if ok, err := st.FreeLease(ctx, b, ttl); err != nil || ok {
		t.Fatalf("free a live lease = %v, %v; want refused", ok, err)
	}
	if ok, err := st.FreeLease(ctx, a, ttl); err != nil || !ok {
		t.Fatalf("free a lapsed lease = %v, %v", ok, err)
	}
	if l, err := st.LapsedLeases(ctx, ttl); err != nil || len(l) != 0 {
		t.Fatalf("lapsed after the free = %v, %v; want none", l, err)
	}
}

// A reservation or a claim made under a lease is recorded with its slot
// and found by it (Owned) while pending, with its Kafka position once
// kept; once confirmed, given back, or made a hold again (Unclaim), it is
// no longer live. Reservations under no lease are not recorded.
func TestOwnedRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sale, item := int64(61), int64(1001)
	st, _ := newShardedStore(t, sale, 1, map[int64]int64{item: 10})
	now := time.UnixMilli(1_800_000_000_000)
	ids := map[int64]string{}
	for u, slot := range map[int64]int{1: 7, 2: 7, 3: 9, 4: 0} {
		ids[u] = newOrderID(t)
		if err := st.ReserveAs(ctx, slot, sale, item, u, ids[u], now); err != nil {
			t.Fatal(err)
		}
	}
	// User 5 holds a unit and claims it under slot 7.
	if err := st.Hold(ctx, sale, item, 5, newOrderID(t), now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	claimed, until, err := st.ClaimAs(ctx, 7, sale, item, 5, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RecordPlaced(ctx, []Placement{{SaleID: sale, UserID: 2, OrderID: ids[2], Partition: 3, Offset: 42}}); err != nil {
		t.Fatal(err)
	}
	owned := func(slots ...int) map[string]Owned {
		t.Helper()
		want := map[int]bool{}
		for _, s := range slots {
			want[s] = true
		}
		list, err := st.Owned(ctx, sale, want)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]Owned{}
		for _, o := range list {
			m[o.OrderID] = o
		}
		return m
	}
	got := owned(7)
	if len(got) != 3 {
		t.Fatalf("owned by slot 7: %+v; want users 1, 2 and 5's claim", got)
	}
	if o := got[ids[1]]; !o.Live || o.Placed || o.UserID != 1 || o.ItemID != item || !o.ReservedAt.Equal(now) {
		t.Errorf("user 1's reservation: %+v", o)
	}
	if o := got[ids[2]]; !o.Live || !o.Placed || o.Partition != 3 || o.Offset != 42 {
		t.Errorf("user 2's placed reservation: %+v", o)
	}
	if o := got[claimed]; !o.Live || o.UserID != 5 {
		t.Errorf("user 5's claim: %+v", o)
	}
	if got := owned(9, 0); len(got) != 1 || got[ids[3]].Slot != 9 {
		t.Errorf("owned by slots 9 and 0: %+v; want user 3's only (no lease: no record)", got)
	}

	if err := st.Confirm(ctx, []Pending{got[ids[2]].Pending}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Release(ctx, sale, 1, item, ids[1]); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Unclaim(ctx, sale, 5, claimed, until); err != nil || !ok {
		t.Fatalf("unclaim = %v, %v", ok, err)
	}
	got = owned(7)
	if _, ok := got[ids[2]]; ok {
		t.Errorf("a confirmed reservation is still recorded: %+v", got[ids[2]])
	}
	for _, id := range []string{ids[1], claimed} {
		if o, ok := got[id]; !ok || o.Live {
			t.Errorf("order %s given back or held again: %+v (recorded %v); want recorded, not live", id, o, ok)
		}
	}
	var stale []Owned
	for _, o := range got {
		stale = append(stale, o)
	}
	if err := st.Disown(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if got := owned(7); len(got) != 0 {
		t.Errorf("after Disown: %+v", got)
	}
}

// A frozen Redis (SIGSTOP) stops the leases' time with it: a lease it
// could not renew during the freeze has not lapsed when Redis wakes.
// Without renewals while the clock is ticked, it lapses.
func TestLeasesStopWithRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.NewRedisServer(t)
	t.Cleanup(func() { _ = srv.Signal(syscall.SIGCONT) })
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	st := New(rdb)
	const ttl = 400 * time.Millisecond
	a, err := st.AcquireLease(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	<-time.After(3 * ttl) // the freeze
	if err := srv.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if l, err := st.LapsedLeases(ctx, ttl); err != nil || len(l) != 0 {
		t.Fatalf("lapsed after a freeze of 3 TTLs = %v, %v; want none", l, err)
	}
	if ok, err := st.RenewLease(ctx, a, ttl); err != nil || !ok {
		t.Fatalf("renew after the freeze = %v, %v; want renewed", ok, err)
	}
	testenv.Eventually(t, "the lease lapsed while the clock ticks", 10*time.Second, func() bool {
		if err := st.leaseOp(ctx, "tick", 0, "", ttl).Err(); err != nil {
			t.Fatal(err)
		}
		l, err := st.LapsedLeases(ctx, ttl)
		return err == nil && len(l) == 1 && l[0] == a
	})
}
