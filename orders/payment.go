package orders

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/events"
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

// paymentLockClass is the first key of the transaction-scoped advisory lock
// taken per payment id, so callbacks of one payment run one at a time
// (Migrate's lock is of the one-key form, which does not overlap).
const paymentLockClass = 18

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
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return recordSignature(ctx, tx, sig, signedAt)
	})
}

// recordSignature inserts a verified signature: errReplayed when it is
// there already. A concurrent copy waits on the key for the first one's
// commit, then finds its row.
func recordSignature(ctx context.Context, tx pgx.Tx, sig string, signedAt time.Time) error {
	tag, err := tx.Exec(ctx, `INSERT INTO payment_signatures (signature, signed_at) VALUES ($1, $2)
		ON CONFLICT (signature) DO NOTHING`, sig, signedAt)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errReplayed
	}
	return nil
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

// shopPaidTx is the callback's transaction; it records the signature
// first when spend is set.
func (s *Service) shopPaidTx(ctx context.Context, p flashsale.ShopPayment, now time.Time, spend bool) (r shopPaidResult, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, paymentLockClass, p.PaymentID); err != nil {
			return err
		}
		if spend {
			if err := recordSignature(ctx, tx, p.Signature, p.SignedAt); err != nil {
				return err
			}
		}
		var prevOrder string
		err := tx.QueryRow(ctx, `SELECT order_id::text, outcome FROM payments WHERE payment_id = $1`, p.PaymentID).Scan(&prevOrder, &r.outcome)
		switch {
		case err == nil && prevOrder != p.OrderID:
			r.found, r.refusal = true, errOtherOrder
			return nil
		case err == nil:
			r.found = true
			return nil // the recorded answer; only the signature is new
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		cur, err := scanOrder(tx.QueryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE id = $1 FOR UPDATE`, p.OrderID), now)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // the signature alone
		}
		if err != nil {
			return err
		}
		r.found = true
		var currency string
		if err := tx.QueryRow(ctx, `SELECT currency FROM items WHERE id = $1`, cur.ItemID).Scan(&currency); err != nil {
			return fmt.Errorf("item %d of order %s: %w", cur.ItemID, cur.ID, err)
		}
		ev := events.Event{
			Type: events.TypePaymentRefused, OccurredAt: now, OrderID: cur.ID, SaleID: cur.SaleID, ItemID: cur.ItemID,
			UserID: cur.UserID, Status: cur.Status, PriceCents: cur.PriceCents, PaymentID: p.PaymentID,
		}
		switch {
		case p.AmountCents != cur.PriceCents || p.Currency != currency:
			// Whatever the order's state: this payment is not its price.
			r.outcome, ev.Reason = outcomeMismatch, ReasonMismatch
		case cur.Status == flashsale.OrderPending && now.Before(cur.ExpiresAt):
			if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'PAID', paid_at = $2, updated_at = now() WHERE id = $1`, cur.ID, now); err != nil {
				return err
			}
			r.outcome, r.paid = outcomePaid, cur
			r.paid.Status, r.paid.Payable = flashsale.OrderPaid, false
			ev.Type, ev.Status = events.TypePaid, flashsale.OrderPaid
		case cur.Status == flashsale.OrderPending, cur.Status == flashsale.OrderExpired:
			// A PENDING order past its window is left to the expiry
			// worker, which gives its unit back; the refusal takes nothing.
			r.outcome, ev.Reason = outcomeExpired, ReasonExpired
		case cur.Status == flashsale.OrderCancelled, cur.Status == flashsale.OrderRejected:
			r.outcome, ev.Reason = outcomeCancelled, ReasonCancelled
		case cur.Status == flashsale.OrderPaid:
			r.outcome, ev.Reason = outcomeDuplicate, ReasonDuplicate
		default:
			return fmt.Errorf("order %s in unknown status %q", cur.ID, cur.Status)
		}
		if err := events.Append(ctx, tx, ev); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO payments (payment_id, order_id, outcome, amount_cents, currency, created_at)
			VALUES ($1, $2, $3, $4, $5, $6)`, p.PaymentID, p.OrderID, r.outcome, p.AmountCents, p.Currency, now)
		return err
	})
	if err != nil {
		return shopPaidResult{}, err
	}
	return r, nil
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
	_, err := s.pool.Exec(ctx, `DELETE FROM payment_signatures WHERE signature IN (
		SELECT signature FROM payment_signatures WHERE signed_at < $1 LIMIT 100 FOR UPDATE SKIP LOCKED)`, now.Add(-SignatureKeep))
	if err != nil {
		s.log.Warn("old payment signatures not deleted; a later callback retries", "err", err)
	}
}
