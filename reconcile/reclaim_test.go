package reconcile

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/purchase"
)

// commitToEnd commits the writer group's offsets at the end of every
// partition of the orders topic: the writer has consumed everything.
func commitToEnd(t *testing.T, k *testenv.Kafka) {
	t.Helper()
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, flashsale.TopicOrders)
	if err != nil {
		t.Fatal(err)
	}
	var offs kadm.Offsets
	ends.Each(func(o kadm.ListedOffset) {
		offs.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset, LeaderEpoch: -1})
	})
	if err := adm.CommitAllOffsets(ctx, kafka.DefaultWriterGroup, offs); err != nil {
		t.Fatal(err)
	}
}

// A gateway's lease lapses (it stopped renewing: died or froze). Its
// reservation that never reached Kafka is declared lost at once, without
// waiting for the reconcile bound (2 minutes by default, never reached on
// this test's clock): REJECTED, its unit back. Its reservation Kafka
// acknowledged is left to the writer. The slot is freed once settled.
// (That the gateway answers 503, never 202, for an order it publishes
// after the lease stopped being valid there is purchase's
// TestLeaseLapsedPublishIsUncertain.)
func TestReclaimLapsedLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 5)
	item := e.item(0)
	k := testenv.NewKafka(t)
	const ttl = 600 * time.Millisecond
	leaser := purchase.NewLeaser(e.st, ttl, nil, nil)
	lctx, lstop := context.WithCancel(ctx)
	ldone := make(chan struct{})
	go func() { _ = leaser.Run(lctx); close(ldone) }()
	stopLeaser := func() { lstop(); <-ldone }
	t.Cleanup(stopLeaser)
	testenv.Eventually(t, "a lease", 10*time.Second, func() bool { return leaser.Slot() > 0 })
	tk := leaser.Ticket()
	slot := tk.Slot()

	s := purchase.New(purchase.Config{Now: newClock(t0).now, Lease: leaser}, e.st, newProducer(t, k, 3*time.Second), nil, nil)
	sctx, sstop := context.WithCancel(ctx)
	sdone := make(chan error, 1)
	go func() { sdone <- s.Run(sctx) }()
	t.Cleanup(func() { sstop(); <-sdone })
	acked, err := s.Reserve(ctx, e.sale, item, 1)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the acknowledged order's position kept", 10*time.Second, func() bool {
		n, err := e.rdb.HLen(ctx, fmt.Sprintf("fs:{s%d}:placed", e.sale.ID)).Result()
		return err == nil && n == 1
	})
	// The gateway reserved for user 2 and died before its publish.
	orphan := uuid.NewString()
	if err := e.st.ReserveAs(ctx, slot, e.sale.ID, item.ID, 2, orphan, t0); err != nil {
		t.Fatal(err)
	}

	stopLeaser() // the gateway dies or freezes: no more renewals
	testenv.Eventually(t, "the lease no longer valid here", 10*time.Second, func() bool { return !leaser.Holds(tk) })

	commitToEnd(t, k)
	r := New(Config{Now: newClock(t0).now, Orders: newOrderLog(t, k), LeaseTTL: ttl}, e.pool, e.st, e, nil, nil)
	returned := 0
	testenv.Eventually(t, "the lapsed lease reclaimed and freed", 20*time.Second, func() bool {
		n, err := r.ReclaimOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		returned += n
		l, err := e.st.LapsedLeases(ctx, ttl)
		return err == nil && returned > 0 && len(l) == 0
	})
	if returned != 1 {
		t.Errorf("%d units returned, want the orphan's 1", returned)
	}
	assertOrder(t, e.pool, orphan, flashsale.OrderRejected)
	if n := e.remaining(t, item); n != 4 {
		t.Errorf("%d units left, want 4 (the acknowledged order's taken)", n)
	}
	if b, ok := e.buyer(t, 1); !ok || b.OrderID != acked {
		t.Errorf("user 1's acknowledged reservation: %+v, %v; want kept for the writer", b, ok)
	}
	if n := e.pending(t); n != 1 {
		t.Errorf("%d pending, want the acknowledged one", n)
	}
}
