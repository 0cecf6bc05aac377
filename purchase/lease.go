package purchase

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/adapter/prom"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// DefaultLeaseTTL is how long a gateway's placement lease lives without a
// renewal (it is renewed every sixth of it). A gateway that dies or
// freezes has its reservations in flight settled by the reconciler
// (reconcile.Reconciler) about this long after its last renewal: the bound
// of "units back within 5 s of a lost gateway". Shorter would free units
// sooner but let a gateway starved of CPU for that long lose its lease and
// answer 503s.
const DefaultLeaseTTL = 3 * time.Second

// leaseMargin is cut from the lease's local validity, so that the gateway
// stops acknowledging under a lease before Redis can see it lapsed
// whatever the two clocks' rates.
const leaseMargin = 10 // percent of the TTL

// Leaser holds this gateway's placement lease (redisstock leases): the
// slot its reservations are recorded under, and whether it may still
// acknowledge one. A reservation made under a slot is acknowledged (202)
// only while the lease that slot belongs to is valid here, that is, before
// Redis can have seen it lapse and the Reconciler have settled its
// reservations: a gateway that wakes from a freeze answers 503 for what it
// made before, and its late records meet the tombstones.
type Leaser struct {
	st  *redisstock.Store
	ttl time.Duration
	log *slog.Logger

	// state is replaced whole; nil or slot 0: no lease.
	state atomic.Pointer[leaseState]
	lost  prometheus.Counter
	slotG prometheus.Gauge
}

type leaseState struct {
	lease redisstock.Lease
	// validUntil is local time (monotonic): the renewal's start plus the
	// TTL less the margin. Redis saw the renewal no earlier than it
	// started, so it cannot see the lease lapse before this.
	validUntil time.Time
}

// NewLeaser returns a Leaser (DefaultLeaseTTL when ttl ≤ 0). reg may be nil.
func NewLeaser(st *redisstock.Store, ttl time.Duration, logger *slog.Logger, reg prometheus.Registerer) *Leaser {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	l := &Leaser{st: st, ttl: ttl, log: logger.With("component", "lease")}
	var err1, err2 error
	l.lost, err1 = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_purchase_lease_lost_total",
		Help: "Placement leases this gateway found lapsed at a renewal (it was frozen or cut off from Redis longer than the lease lives)."}))
	l.slotG, err2 = prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "flashsale_purchase_lease_slot",
		Help: "The slot of this gateway's placement lease (0: none)."}))
	if err := errors.Join(err1, err2); err != nil {
		l.log.Error("lease metrics not exported", "err", err)
	}
	return l
}

// TTL is the lease's time to live.
func (l *Leaser) TTL() time.Duration { return l.ttl }

// Ticket names what a reservation is made under: the lease valid here
// when it is made (its slot is recorded with the reservation), or none,
// and when it is made (local time).
type Ticket struct {
	lease redisstock.Lease
	at    time.Time
}

// Slot is the slot to record the reservation under: 0 when it was made
// under no lease (it is then settled after the reconcile bound, as before
// leases).
func (t Ticket) Slot() int { return t.lease.Slot }

// Ticket is what a reservation made now is made under: the lease valid
// here, or none.
func (l *Leaser) Ticket() Ticket {
	t := Ticket{at: time.Now()}
	if l == nil {
		return t
	}
	if st := l.state.Load(); st != nil && t.at.Before(st.validUntil) {
		t.lease = st.lease
	}
	return t
}

// shown is t for a reservation Redis has just shown at at: ran (its answer
// read), or named as the user's (ALREADY_PURCHASED, a settle's read). One
// made under no lease is then counted from at, not from its making: a
// reservation that waited in a frozen Redis's socket is no older than
// Redis's answer, and were Redis lost after that answer, the loss would
// be seen later still, and the rebuild would read the orders topic's end
// one lease TTL after that; the lease's margin covers the moments between
// Redis running it and this gateway reading the answer. One made under a
// lease keeps it: when that lease lapsed, the reconciler may be settling
// the reservation already.
func (t Ticket) shown(at time.Time) Ticket {
	if t.lease.Slot == 0 {
		t.at = at
	}
	return t
}

// Unleased is a ticket naming no lease (a sharded sale's reservations are
// recorded under none), made now.
func Unleased() Ticket { return Ticket{at: time.Now()} }

// Slot is the slot a reservation made now is recorded under (0: none).
func (l *Leaser) Slot() int { return l.Ticket().Slot() }

// Holds reports whether a reservation made under t may be acknowledged
// now. Under a lease, only while that very lease (slot and token: a slot
// taken again after Redis lost its leases is another lease) is valid here.
// Under none, only within the lease's local validity (the TTL less the
// margin) of Redis showing the reservation (Ticket.shown): the Redis-loss
// rebuild waits one TTL after the loss was seen and then fences off every
// record it has not counted (reconcile/rebuild.go), so no reservation of
// a lost Redis may be acknowledged later than a lease could be. Without a
// Leaser, always.
func (l *Leaser) Holds(t Ticket) bool {
	if l == nil {
		return true
	}
	now := time.Now()
	if t.lease.Slot == 0 {
		return now.Sub(t.at) < l.ttl-l.ttl*leaseMargin/100
	}
	st := l.state.Load()
	return st != nil && st.lease == t.lease && now.Before(st.validUntil)
}

// Run takes a lease and renews it every sixth of its TTL until ctx ends;
// a lease found lost is replaced by a new one. It returns nil then; the
// lease is left to lapse, so that what this gateway still had in flight is
// settled by the Reconciler.
func (l *Leaser) Run(ctx context.Context) error {
	t := time.NewTicker(l.ttl / 6)
	defer t.Stop()
	for {
		l.renew(ctx)
		select {
		case <-ctx.Done():
			// The lease stays valid here until it runs out, so that
			// purchases still finishing are acknowledged.
			return nil
		case <-t.C:
		}
	}
}

// renew is one step of Run: take a lease when none is held, else renew it.
func (l *Leaser) renew(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, l.ttl/2)
	defer cancel()
	start := time.Now()
	valid := start.Add(l.ttl - l.ttl*leaseMargin/100)
	st := l.state.Load()
	if st == nil {
		lease, err := l.st.AcquireLease(rctx, l.ttl)
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("no placement lease; reservations are settled after the reconcile bound meanwhile", "err", err)
			}
			return
		}
		l.state.Store(&leaseState{lease: lease, validUntil: valid})
		l.slotG.Set(float64(lease.Slot))
		l.log.Info("placement lease taken", "slot", lease.Slot)
		return
	}
	ok, err := l.st.RenewLease(rctx, st.lease, l.ttl)
	if err != nil {
		// Its validity runs out by itself; the next renewal may still
		// find it held.
		return
	}
	if !ok {
		l.state.Store(nil)
		l.slotG.Set(0)
		l.lost.Inc()
		l.log.Warn("placement lease lost (this gateway was frozen or cut off from Redis); what it made under it is settled by the reconciler", "slot", st.lease.Slot)
		l.renew(ctx)
		return
	}
	l.state.Store(&leaseState{lease: st.lease, validUntil: valid})
}
