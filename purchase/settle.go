package purchase

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/flashsale/flashsale"
)

// Uncertain reservations.
//
// A reservation script cut short by the Redis timeout (Redis frozen, its
// answer lost) may have run, or may still run: the command was sent, and
// Redis executes it when it reads it. Such a purchase is uncertain, as a
// publish whose acknowledgement never came is: the shopper is answered
// 503 UNAVAILABLE with the order's id (a claim's id is not known before
// Redis answers) and Retry-After, and this gateway settles it once Redis
// answers again. Giving the unit back at once cannot work: the give-back
// is cut short as well, and a reservation that ran was left for the
// Reconciler to reject after its bound, while the shopper, retrying, was
// told ALREADY_PURCHASED for it.
//
// Settling (Run, every settleEvery): the user's buyer record is read until
// two reads settleMargin apart both succeed. Redis runs the commands of a
// connection in order and reads every ready connection in each turn of
// its event loop, so by the second answer a command sent before the
// freeze has run or never will (its connection was closed unsent), and
// the second read is final:
//
//   - the record names the order (for a claim: the user's record, with no
//     hold left): the order is published as made at the purchase's time
//     (a live order), and given back if Kafka refuses it;
//   - otherwise nothing was reserved: the shopper's order lookup finds no
//     such order, and a new purchase reserves.
//
// A retry that Redis answers ALREADY_PURCHASED with an order this gateway
// holds unsettled settles it at once and is answered 202 with it. An
// order is settled once: whoever takes it out of the set settles it. A
// gateway that dies with orders unsettled leaves them to the Reconciler.
//
// Late publishes. A publish whose bound passed while franz-go still held
// the record (the broker away, or slow) is uncertain too, and the same set
// keeps it with the record's outcome (kafka.PublishError.Outcome), which
// franz-go decides once the broker answers, within moments of its return.
// Settling reads that outcome without waiting:
//
//   - written: the writer stores the order, as for a publish in time;
//   - refused (a definite failure: the record never will be written): the
//     reservation is given back at once, a claim's unit held for the user
//     again for the rest of the window, instead of waiting out the
//     Reconciler's bound while the sale goes on without that unit;
//   - still uncertain, or unknown after lateKeep: the Reconciler's.
//
// A retry that meets the order answers what is known: 202 once written; a
// new reservation (the claim of the unit held again) once refused; 503
// with the order's id while nobody knows, never ALREADY_PURCHASED for an
// order that may end REJECTED. Giving back twice is harmless: the release
// and the unclaim act only on the buyer record of this very order.

// Settling bounds.
const (
	settleEvery  = 250 * time.Millisecond
	settleMargin = 250 * time.Millisecond
	// maxUnsettled bounds the orders one gateway keeps to settle; beyond
	// it an uncertain reservation is left to the Reconciler.
	maxUnsettled = 100_000
	// lateKeep bounds how long a late publish waits for its outcome here
	// (then the Reconciler settles it).
	lateKeep = 10 * time.Minute
)

// errTryAgain tells a retry that the order it met was refused and its
// reservation undone: the retry reserves (or claims) anew.
var errTryAgain = errors.New("the order was refused after its bound; reserve again")

// unsettled is an uncertain reservation (or claim) to settle.
type unsettled struct {
	sale    *flashsale.Sale
	item    flashsale.Item
	userID  int64
	orderID string // "" for a claim, until Redis names it
	at      time.Time
	claim   bool
	ticket  Ticket // the placement lease it was made under, or none
	// late, for a late publish, reads the record's outcome; until is a
	// claim's window end, for holding the unit again.
	late  func() (bool, error)
	until time.Time
	// answeredAt is when a read of the user's record first succeeded
	// (zero: not yet).
	answeredAt time.Time
}

// settleSet is a Service's unsettled orders, by order id (a claim, whose
// id is not known, by claimKey).
type settleSet struct {
	mu sync.Mutex
	m  map[string]*unsettled
}

func claimKey(saleID, userID int64) string {
	return "claim/" + strconv.FormatInt(saleID, 10) + "/" + strconv.FormatInt(userID, 10)
}

func (u *unsettled) key() string {
	if u.claim && u.late == nil {
		return claimKey(u.sale.ID, u.userID)
	}
	return u.orderID
}

// add keeps u to settle; false when the set is full.
func (ss *settleSet) add(u *unsettled) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = map[string]*unsettled{}
	}
	if len(ss.m) >= maxUnsettled {
		return false
	}
	ss.m[u.key()] = u
	return true
}

// take removes and returns the user's unsettled order orderID in the
// sale, or the user's unsettled claim there ("" takes only the claim).
func (ss *settleSet) take(saleID, userID int64, orderID string) *unsettled {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, k := range []string{orderID, claimKey(saleID, userID)} {
		if u := ss.m[k]; k != "" && u != nil && u.sale.ID == saleID && u.userID == userID {
			delete(ss.m, k)
			return u
		}
	}
	return nil
}

// all returns every unsettled order (they stay in the set).
func (ss *settleSet) all() []*unsettled {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*unsettled, 0, len(ss.m))
	for _, u := range ss.m {
		out = append(out, u)
	}
	return out
}

// remove takes u out of the set; false when a retry took it first (the
// retry settles it).
func (ss *settleSet) remove(u *unsettled) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m[u.key()] != u {
		return false
	}
	delete(ss.m, u.key())
	return true
}

// Unsettled is how many uncertain reservations this gateway holds to settle.
func (s *Service) Unsettled() int {
	s.settle.mu.Lock()
	defer s.settle.mu.Unlock()
	return len(s.settle.m)
}

// uncertainReserve keeps a reservation cut short by Redis to settle and
// returns the shopper's answer: 503 with the order's id when known.
func (s *Service) uncertainReserve(u *unsettled, cause error) error {
	s.outcomes[OutcomeReserveUncertain].Inc()
	if !s.settle.add(u) {
		s.log.Warn("too many uncertain reservations to settle; left to the reconciler", "sale", u.sale.ID, "user", u.userID, "order", u.orderID)
	}
	return fmt.Errorf("%w: %w", &flashsale.Error{
		Code:    flashsale.CodeUnavailable,
		Message: "your purchase could not be confirmed yet; look for your order in this sale shortly, or try again",
		OrderID: u.orderID,
	}, cause)
}

// settleLoop settles every settleEvery until ctx ends; what is left
// unsettled then is the Reconciler's.
func (s *Service) settleLoop(ctx context.Context) {
	t := time.NewTicker(settleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if n := s.Unsettled(); n > 0 {
				s.log.Warn("stopping with uncertain reservations unsettled; left to the reconciler", "orders", n)
			}
			return
		case <-t.C:
		}
		s.settleAll(ctx)
	}
}

// settleAll looks at every unsettled order once (settleLoop's tick).
func (s *Service) settleAll(ctx context.Context) {
	for _, u := range s.settle.all() {
		if ctx.Err() != nil {
			return
		}
		s.settleOne(ctx, u)
	}
}

// keepLate keeps an uncertain publish whose record franz-go still holds
// (err carries its outcome) to settle when the outcome is known.
func (s *Service) keepLate(u *unsettled, err error) {
	var pe interface{ Outcome() (bool, error) }
	if !errors.As(err, &pe) {
		return // not a publish that timed out: the Reconciler's
	}
	u.late = pe.Outcome
	if !s.settle.add(u) {
		s.log.Warn("too many uncertain reservations to settle; left to the reconciler", "sale", u.sale.ID, "user", u.userID, "order", u.orderID)
	}
}

// settleLate settles a late publish whose outcome is known (see the
// section comment). Only settleLoop's goroutine calls it.
func (s *Service) settleLate(ctx context.Context, u *unsettled) {
	known, err := u.late()
	if !known {
		if s.now().Sub(u.at) > lateKeep {
			s.settle.remove(u)
		}
		return
	}
	if !s.settle.remove(u) {
		return
	}
	s.lateOutcome(context.WithoutCancel(ctx), u, err)
}

// lateOutcome acts on a late publish's known outcome err and reports
// whether its reservation was undone.
func (s *Service) lateOutcome(work context.Context, u *unsettled, err error) bool {
	switch {
	case err == nil:
		s.outcomes[OutcomeLateWritten].Inc()
		return false
	case uncertain(err):
		return false // the Reconciler's
	}
	s.outcomes[OutcomeLateFailed].Inc()
	if u.claim {
		s.unclaim(work, u.sale.ID, u.userID, u.orderID, u.until)
	} else {
		s.release(work, u.sale.ID, u.userID, u.item.ID, u.orderID)
	}
	return true
}

// settleOne reads u's record and, on the second read that succeeds at
// least settleMargin after the first, settles u (unless a retry took it
// meanwhile). Only settleLoop's goroutine calls it.
func (s *Service) settleOne(ctx context.Context, u *unsettled) {
	if u.late != nil {
		s.settleLate(ctx, u)
		return
	}
	rctx, cancel := context.WithTimeout(ctx, s.redisTimeout)
	defer cancel()
	asked := time.Now()
	b, found, err := s.st.Buyer(rctx, u.sale.ID, u.userID)
	if err != nil {
		u.answeredAt = time.Time{}
		return
	}
	now := time.Now() // real time: how long Redis has been answering
	if u.answeredAt.IsZero() || now.Sub(u.answeredAt) < settleMargin {
		if u.answeredAt.IsZero() {
			u.answeredAt = now
		}
		return
	}
	orderID := u.orderID
	if u.claim {
		orderID = b.OrderID
	}
	ran := found && b.OrderID == orderID
	if ran && u.claim {
		_, _, held, err := s.st.Held(rctx, u.sale.ID, u.userID)
		if err != nil {
			return
		}
		ran = !held // still held: the claim never ran, the hold stands
	}
	if ran {
		u.seenIn(asked)
	}
	if u.ticket.Slot() != 0 && !s.lease.Holds(u.ticket) && s.lease.Slot() == 0 {
		// The lease is not renewed yet since Redis woke: publish once it
		// is, or the order would be answered 503 for no reason.
		return
	}
	if !s.settle.remove(u) {
		return
	}
	if !ran {
		s.outcomes[OutcomeUncertainNone].Inc()
		return
	}
	if err := s.publishSettled(context.WithoutCancel(ctx), u, orderID); err != nil {
		s.log.Warn("an uncertain reservation ran but was not published", "order", orderID, "sale", u.sale.ID, "err", err)
	}
}

// publishSettled publishes u's order, found reserved, as made at u.at; a
// refused publish gives its unit back (a claim's too: the window is not
// known here, so the unit goes to the next in line).
func (s *Service) publishSettled(work context.Context, u *unsettled, orderID string) error {
	err := s.place(work, u.sale, u.item, u.userID, orderID, u.at, u.ticket)
	if err != nil && !uncertain(err) {
		s.release(work, u.sale.ID, u.userID, u.item.ID, orderID)
	}
	return err
}

// seenIn notes that Redis showed u's reservation in its data at asked (or
// later): see Ticket.shown.
func (u *unsettled) seenIn(asked time.Time) { u.ticket = u.ticket.shown(asked) }

// settleRetry settles, at once, the user's unsettled order that Redis has
// just named (alreadyErr: ALREADY_PURCHASED with its id), and answers the
// retry: the order's id (202) once published. ok is false when this
// gateway holds no such order (the caller answers alreadyErr).
func (s *Service) settleRetry(ctx context.Context, sale *flashsale.Sale, userID int64, alreadyErr error) (string, bool, error) {
	var fe *flashsale.Error
	if !errors.As(alreadyErr, &fe) || fe.OrderID == "" {
		return "", false, nil
	}
	u := s.settle.take(sale.ID, userID, fe.OrderID)
	if u == nil {
		return "", false, nil
	}
	if u.late != nil {
		return s.retryLate(ctx, u)
	}
	u.seenIn(time.Now())
	if err := s.publishSettled(context.WithoutCancel(ctx), u, fe.OrderID); err != nil {
		return "", true, err
	}
	return fe.OrderID, true, nil
}

// retryLate answers a retry that met u, a late publish taken out of the
// set: 202 with its order once written, errTryAgain once refused (its
// reservation undone), and 503 with its id while the outcome is unknown
// (u goes back to the set).
func (s *Service) retryLate(ctx context.Context, u *unsettled) (string, bool, error) {
	known, err := u.late()
	switch {
	case !known:
		if !s.settle.add(u) {
			s.log.Warn("too many uncertain reservations to settle; left to the reconciler", "sale", u.sale.ID, "user", u.userID, "order", u.orderID)
		}
	case s.lateOutcome(context.WithoutCancel(ctx), u, err):
		return "", true, errTryAgain
	case err == nil && s.lease.Holds(u.ticket):
		return u.orderID, true, nil
	}
	// Written after the lease it was made under lapsed here, the order may
	// be the Reconciler's to settle (as in place): unknown.
	s.outcomes[OutcomePublishUncertain].Inc()
	return "", true, &flashsale.Error{
		Code:    flashsale.CodeUnavailable,
		Message: "your order could not be confirmed yet; look for it in this sale shortly",
		OrderID: u.orderID,
	}
}
