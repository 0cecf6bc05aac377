package orders

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
)

// Outcomes of a provider's payment, as the payments table records them:
// PAID, or the code of the refusal.
const (
	outcomePaid      = "PAID"
	outcomeExpired   = string(flashsale.CodeOrderExpired)
	outcomeCancelled = string(flashsale.CodeOrderCancelled)
	outcomeDuplicate = string(flashsale.CodeOrderPaid)
	outcomeMismatch  = string(flashsale.CodePaymentMismatch)
)

// Reasons of a payment.refused event.
const (
	ReasonExpired   = "ORDER_EXPIRED"
	ReasonCancelled = "ORDER_CANCELLED"
	ReasonDuplicate = "DUPLICATE_PAYMENT"
	ReasonMismatch  = "PAYMENT_MISMATCH"
)

var (
	errShopExpired   = &flashsale.Error{Code: flashsale.CodeOrderExpired, Message: "the payment window of this order had passed; refund the payment"}
	errShopCancelled = &flashsale.Error{Code: flashsale.CodeOrderCancelled, Message: "this order was cancelled or refused; refund the payment"}
	errShopDuplicate = &flashsale.Error{Code: flashsale.CodeOrderPaid, Message: "this order was already paid by another payment; refund this one"}
	errReplayed      = &flashsale.Error{Code: flashsale.CodeReplayed, Message: "this exact signed request was already received; sign a retry anew"}
	errShopMismatch  = &flashsale.Error{Code: flashsale.CodePaymentMismatch, Message: "the payment's amount or currency is not the order's price; refund the payment"}
	errOtherOrder    = flashsale.Invalid("paymentId", "already recorded for another order")
)

// outcomeErr is the answer of a recorded outcome: nil for PAID, else its
// refusal.
func outcomeErr(outcome string) error {
	switch outcome {
	case outcomePaid:
		return nil
	case outcomeExpired:
		return errShopExpired
	case outcomeCancelled:
		return errShopCancelled
	case outcomeDuplicate:
		return errShopDuplicate
	case outcomeMismatch:
		return errShopMismatch
	}
	return fmt.Errorf("unknown payment outcome %q", outcome)
}

// ShopPaid records a payment the shop's provider reports for an order
// (whose signature the caller verified), idempotently by payment id:
//
//   - the order PENDING and inside its window becomes PAID, with its
//     order.paid event, in one transaction; nil;
//   - an amount or currency other than the order's is refused
//     PAYMENT_MISMATCH; past its window (EXPIRED, or PENDING past
//     expires_at) ORDER_EXPIRED, CANCELLED or REJECTED ORDER_CANCELLED,
//     PAID by another payment ORDER_PAID: nothing paid, no stock moved,
//     and one payment.refused event the shop can refund from;
//   - the same payment id again answers the recorded outcome and changes
//     nothing.
//
// The signature is recorded whatever the answer, so no signature is
// accepted twice (REPLAYED), fleet-wide: with the payment, its outcome and
// its event when there is one, alone otherwise. Answers that record the
// signature only: NOT_FOUND (unknown order), NOT_PAYABLE_YET (accepted
// but not yet in PostgreSQL; retry signed anew), INVALID (payment id of
// another order, malformed id). REPLAYED and UNAVAILABLE record nothing.
func (s *Service) ShopPaid(ctx context.Context, p flashsale.ShopPayment) error {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	id, err := ParseID(p.OrderID)
	if err != nil {
		if serr := s.spendSignature(ctx, p.Signature, p.SignedAt); serr != nil {
			return internal("orders.ShopPaid", serr)
		}
		return err
	}
	p.OrderID = id
	if err := s.shopPaid(ctx, p); err != nil {
		return internal("orders.ShopPaid", err)
	}
	return nil
}

// SpendSignature records the signature of a verified callback refused
// before ShopPaid (malformed), so it is never accepted again: REPLAYED
// when it already was recorded, UNAVAILABLE.
func (s *Service) SpendSignature(ctx context.Context, sig string, signedAt time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	if err := s.spendSignature(ctx, sig, signedAt); err != nil {
		return internal("orders.SpendSignature", err)
	}
	return nil
}

func (s *Service) spendSignature(ctx context.Context, sig string, signedAt time.Time) error {
	return replayed(s.store.SpendSignature(ctx, sig, signedAt))
}

// replayed answers the store's ErrReplayed as REPLAYED.
func replayed(err error) error {
	if errors.Is(err, orderstore.ErrReplayed) {
		return errReplayed
	}
	return err
}

func (s *Service) shopPaid(ctx context.Context, p flashsale.ShopPayment) error {
	spent := false // the signature is committed
	for attempt := 0; ; attempt++ {
		now := s.now()
		r, err := s.shopPaidTx(ctx, p, now, !spent)
		if err != nil {
			return err
		}
		spent = true
		if r.found {
			if r.outcome == outcomePaid && r.paid.ID != "" {
				// So that a read while PostgreSQL is unreachable still
				// answers PAID; the payment itself is in the database.
				if err := s.stock.MarkPaid(ctx, r.paid.SaleID, r.paid.ID, now); err != nil {
					s.log.Warn("paid marker not written in Redis", "order", r.paid.ID, "err", err)
				}
			}
			s.forgetSignatures(ctx, now)
			if r.refusal != nil {
				return r.refusal
			}
			return outcomeErr(r.outcome)
		}
		// Not in PostgreSQL: accepted and on its way, or unknown.
		inFlight, err := s.inFlight(ctx, p.OrderID, now)
		if err != nil {
			return err
		}
		if inFlight {
			return errNotPayable
		}
		if attempt >= 1 {
			return errNotFound
		}
		// The writer may have stored it (and Redis forgotten it) between
		// the two looks: look again.
	}
}

// shopPaidResult is what a callback's transaction committed. found is
// false when the order is not in PostgreSQL (only the signature was
// recorded); paid is set when this call paid the order; refusal is an
// answer recorded with no payment row (a payment id of another order).
type shopPaidResult struct {
	outcome string
	paid    flashsale.Order
	found   bool
	refusal error
}

// shopPaidTx is the callback's transaction in the order store; it records
// the signature first when spend is set.
func (s *Service) shopPaidTx(ctx context.Context, p flashsale.ShopPayment, now time.Time, spend bool) (shopPaidResult, error) {
	res, err := s.store.RecordPayment(ctx, orderstore.Payment{
		PaymentID: p.PaymentID, OrderID: p.OrderID, Currency: p.Currency, AmountCents: p.AmountCents,
		Signature: p.Signature, SignedAt: p.SignedAt,
	}, now, spend, func(cur flashsale.Order, currency string) (orderstore.Verdict, error) {
		return verdict(p, cur, currency, now)
	})
	if err != nil {
		return shopPaidResult{}, replayed(err)
	}
	r := shopPaidResult{outcome: res.Outcome, paid: res.Paid, found: res.Found}
	if res.OtherOrder {
		r.refusal = errOtherOrder
	}
	return r, nil
}

// verdict is the answer to a payment for the order cur as it stands (its
// item's currency), at now.
func verdict(p flashsale.ShopPayment, cur flashsale.Order, currency string, now time.Time) (orderstore.Verdict, error) {
	switch {
	case p.AmountCents != cur.PriceCents || p.Currency != currency:
		// Whatever the order's state: this payment is not its price.
		return orderstore.Verdict{Outcome: outcomeMismatch, Reason: ReasonMismatch}, nil
	case cur.Status == flashsale.OrderPending && now.Before(cur.ExpiresAt):
		return orderstore.Verdict{Outcome: outcomePaid, Pay: true}, nil
	case cur.Status == flashsale.OrderPending, cur.Status == flashsale.OrderExpired:
		// A PENDING order past its window is left to the expiry
		// worker, which gives its unit back; the refusal takes nothing.
		return orderstore.Verdict{Outcome: outcomeExpired, Reason: ReasonExpired}, nil
	case cur.Status == flashsale.OrderCancelled, cur.Status == flashsale.OrderRejected:
		return orderstore.Verdict{Outcome: outcomeCancelled, Reason: ReasonCancelled}, nil
	case cur.Status == flashsale.OrderPaid:
		return orderstore.Verdict{Outcome: outcomeDuplicate, Reason: ReasonDuplicate}, nil
	}
	return orderstore.Verdict{}, fmt.Errorf("order %s in unknown status %q", cur.ID, cur.Status)
}

// inFlight reports whether Redis holds orderID as a reservation not yet
// confirmed in PostgreSQL (accepted, on its way through Kafka). Only the
// open sales' unconfirmed reservations are read, which the writer keeps
// few.
func (s *Service) inFlight(ctx context.Context, orderID string, now time.Time) (bool, error) {
	if s.sales == nil {
		return false, nil
	}
	for _, sl := range s.sales.Sales() {
		if now.Before(sl.StartsAt.Add(-time.Minute)) {
			continue // not open yet: nobody holds a reservation
		}
		ps, err := s.stock.PendingBefore(ctx, sl.ID, now.Add(24*time.Hour), 0)
		if err != nil {
			return false, fmt.Errorf("%w: %w", errUnavailable, err)
		}
		for _, p := range ps {
			if strings.EqualFold(p.OrderID, orderID) {
				return true, nil
			}
		}
	}
	return false, nil
}

// SignatureKeep is how long an accepted callback's signature is kept: past
// twice the replay window, a replay is refused as stale on any gateway
// whose clock is within the window of the signer's.
const SignatureKeep = 10 * time.Minute

// forgetSignatures deletes a bounded number of signatures older than
// SignatureKeep; each callback clears some, so the table stays at about
// the callbacks of the last minutes. Rows another callback is deleting are
// skipped. A failure is logged: the rows are deleted by a later callback.
func (s *Service) forgetSignatures(ctx context.Context, now time.Time) {
	if err := s.store.ForgetSignatures(ctx, now.Add(-SignatureKeep)); err != nil {
		s.log.Warn("old payment signatures not deleted; a later callback retries", "err", err)
	}
}
