package purchase

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
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
	tk := leaser.Ticket()

	s := New(Config{Now: newClock(t0).now, Lease: leaser}, e.st, newProducer(t, k, 3*time.Second), nil, nil)
	sctx, sstop := context.WithCancel(ctx)
	sdone := make(chan error, 1)
	go func() { sdone <- s.Run(sctx) }()
	t.Cleanup(func() { sstop(); <-sdone })
	if _, err := s.Reserve(ctx, e.sale, item, 1); err != nil {
		t.Fatalf("Reserve under a valid lease: %v", err)
	}

	stopLeaser()
	testenv.Eventually(t, "the lease no longer valid here", 10*time.Second, func() bool { return !leaser.Holds(tk) })
	late := uuid.NewString()
	err := s.place(ctx, e.sale, item, 3, late, t0, tk)
	var fe *flashsale.Error
	if !errors.As(err, &fe) || fe.Code != flashsale.CodeUnavailable || fe.OrderID != late || !uncertain(err) {
		t.Fatalf("publish after the lease ended = %v; want 503 UNAVAILABLE naming %s, uncertain", err, late)
	}
}

// A lease is its slot and its token: after Redis lost the leases, a
// gateway may take the same slot again, and what it made under the old
// lease must not be acknowledged under the new one.
func TestHoldsNamesTheLeaseNotTheSlot(t *testing.T) {
	t.Parallel()
	l := &Leaser{ttl: time.Minute}
	valid := time.Now().Add(time.Minute)
	l.state.Store(&leaseState{lease: redisstock.Lease{Slot: 7, Token: "old"}, validUntil: valid})
	tk := l.Ticket()
	if tk.Slot() != 7 || !l.Holds(tk) {
		t.Fatalf("ticket %+v under a valid lease: slot %d, holds %v; want 7, true", tk, tk.Slot(), l.Holds(tk))
	}
	l.state.Store(&leaseState{lease: redisstock.Lease{Slot: 7, Token: "new"}, validUntil: valid})
	if l.Holds(tk) {
		t.Fatal("a ticket of the old lease holds under a new lease of the same slot")
	}
}

// A reservation made under no lease (none held yet, or a sharded sale) is
// acknowledged only within the lease's local validity of its making: a
// Redis-loss rebuild waits that long and fences off later records.
func TestUnleasedTicketHoldsForTheLeaseSpan(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	l := &Leaser{ttl: ttl}
	tk := l.Ticket()
	if tk.Slot() != 0 || !l.Holds(tk) {
		t.Fatalf("a fresh ticket without a lease: slot %d, holds %v; want 0, true", tk.Slot(), l.Holds(tk))
	}
	old := Ticket{at: time.Now().Add(-ttl * (100 - leaseMargin) / 100)}
	if l.Holds(old) {
		t.Fatal("a ticket without a lease holds past the lease's local validity")
	}
	if !(*Leaser)(nil).Holds(old) {
		t.Fatal("without a Leaser every ticket holds")
	}
}
