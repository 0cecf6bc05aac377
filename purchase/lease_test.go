package purchase

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// A gateway's lease stops being valid here (it stopped renewing: died or
// froze): an order published after that is answered 503 with its id,
// uncertain, never 202, because the reconciler may already have settled
// what was made under the lease (reconcile/reclaim.go tests that side).
func TestLeaseLapsedPublishIsUncertain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 5)
	item := e.item(0)
	k := testenv.NewKafka(t)
	const ttl = 600 * time.Millisecond
	leaser := NewLeaser(e.st, ttl, nil, nil)
	lctx, lstop := context.WithCancel(ctx)
	ldone := make(chan struct{})
	go func() { _ = leaser.Run(lctx); close(ldone) }()
	stopLeaser := func() { lstop(); <-ldone }
	t.Cleanup(stopLeaser)
	testenv.Eventually(t, "a lease", 10*time.Second, func() bool { return leaser.Slot() > 0 })
	slot := leaser.Slot()

	s := New(Config{Now: newClock(t0).now, Lease: leaser}, e.st, newProducer(t, k, 3*time.Second), nil, nil)
	sctx, sstop := context.WithCancel(ctx)
	sdone := make(chan error, 1)
	go func() { sdone <- s.Run(sctx) }()
	t.Cleanup(func() { sstop(); <-sdone })
	if _, err := s.Reserve(ctx, e.sale, item, 1); err != nil {
		t.Fatalf("Reserve under a valid lease: %v", err)
	}

	stopLeaser()
	testenv.Eventually(t, "the lease no longer valid here", 10*time.Second, func() bool { return !leaser.Holds(slot) })
	late := uuid.NewString()
	err := s.place(ctx, e.sale, item, 3, late, t0, slot)
	var fe *flashsale.Error
	if !errors.As(err, &fe) || fe.Code != flashsale.CodeUnavailable || fe.OrderID != late || !uncertain(err) {
		t.Fatalf("publish after the lease ended = %v; want 503 UNAVAILABLE naming %s, uncertain", err, late)
	}
}
