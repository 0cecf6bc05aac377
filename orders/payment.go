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
)

// Reasons of a payment.refused event.
const (
	ReasonExpired   = "ORDER_EXPIRED"
	ReasonCancelled = "ORDER_CANCELLED"
	ReasonDuplicate = "DUPLICATE_PAYMENT"
)

var (
	errShopExpired   = &flashsale.Error{Code: flashsale.CodeOrderExpired, Message: "the payment window of this order had passed; refund the payment"}
	errShopCancelled = &flashsale.Error{Code: flashsale.CodeOrderCancelled, Message: "this order was cancelled or refused; refund the payment"}
	errShopDuplicate = &flashsale.Error{Code: flashsale.CodeOrderPaid, Message: "this order was already paid by another payment; refund this one"}
	errReplayed      = &flashsale.Error{Code: flashsale.CodeReplayed, Message: "this exact signed request was already accepted; sign a retry anew"}
	errAmount        = flashsale.Invalid("amountCents", "must equal the order's price")
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
//   - past its window (EXPIRED, or PENDING past expires_at) it is refused
//     ORDER_EXPIRED, CANCELLED or REJECTED ORDER_CANCELLED, PAID by another
//     payment ORDER_PAID: nothing paid, no stock moved, and one
//     payment.refused event the shop can refund from;
//   - the same payment id again answers the recorded outcome and changes
//     nothing.
//
// The payment, its outcome, its event and the signature commit together;
// a signature already recorded is REPLAYED. Errors that record nothing:
// REPLAYED, NOT_FOUND (unknown order), NOT_PAYABLE_YET (accepted but not
// yet in PostgreSQL; retry), INVALID (amount other than the order's price,
// payment id of another order, malformed id), UNAVAILABLE.
func (s *Service) ShopPaid(ctx context.Context, p flashsale.ShopPayment) error {
	id, err := ParseID(p.OrderID)
	if err != nil {
		return err
	}
	p.OrderID = id
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	if err := s.shopPaid(ctx, p); err != nil {
		return internal("orders.ShopPaid", err)
	}
	return nil
}

func (s *Service) shopPaid(ctx context.Context, p flashsale.ShopPayment) error {
	for attempt := 0; ; attempt++ {
		now := s.now()
		outcome, o, found, err := s.shopPaidTx(ctx, p, now)
		if err != nil {
			return err
		}
		if found {
			if outcome == outcomePaid && o.ID != "" {
				// So that a read while PostgreSQL is unreachable still
				// answers PAID; the payment itself is in the database.
				if err := s.stock.MarkPaid(ctx, o.SaleID, o.ID, now); err != nil {
					s.log.Warn("paid marker not written in Redis", "order", o.ID, "err", err)
				}
			}
			s.forgetSignatures(ctx, now)
			return outcomeErr(outcome)
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

// shopPaidTx is the callback's transaction. found is false when the order
// is not in PostgreSQL (nothing was recorded). o is set when this call
// paid the order.
func (s *Service) shopPaidTx(ctx context.Context, p flashsale.ShopPayment, now time.Time) (outcome string, o flashsale.Order, found bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, paymentLockClass, p.PaymentID); err != nil {
			return err
		}
		// A concurrent replay waits here for the first one's commit, then
		// finds its row.
		tag, err := tx.Exec(ctx, `INSERT INTO payment_signatures (signature, signed_at) VALUES ($1, $2)
			ON CONFLICT (signature) DO NOTHING`, p.Signature, p.SignedAt)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errReplayed
		}
		var prevOrder string
		err = tx.QueryRow(ctx, `SELECT order_id::text, outcome FROM payments WHERE payment_id = $1`, p.PaymentID).Scan(&prevOrder, &outcome)
		switch {
		case err == nil && prevOrder != p.OrderID:
			return errOtherOrder
		case err == nil:
			found = true
			return nil // the recorded answer; only the signature is new
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		cur, err := scanOrder(tx.QueryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE id = $1 FOR UPDATE`, p.OrderID), now)
		if errors.Is(err, pgx.ErrNoRows) {
			return errNotInDB
		}
		if err != nil {
			return err
		}
		found = true
		if p.AmountCents != cur.PriceCents {
			return errAmount
		}
		ev := events.Event{
			Type: events.TypePaymentRefused, OccurredAt: now, OrderID: cur.ID, SaleID: cur.SaleID, ItemID: cur.ItemID,
			UserID: cur.UserID, Status: cur.Status, PriceCents: cur.PriceCents, PaymentID: p.PaymentID,
		}
		switch {
		case cur.Status == flashsale.OrderPending && now.Before(cur.ExpiresAt):
			if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'PAID', paid_at = $2, updated_at = now() WHERE id = $1`, cur.ID, now); err != nil {
				return err
			}
			outcome, o = outcomePaid, cur
			o.Status, o.Payable = flashsale.OrderPaid, false
			ev.Type, ev.Status = events.TypePaid, flashsale.OrderPaid
		case cur.Status == flashsale.OrderPending, cur.Status == flashsale.OrderExpired:
			// A PENDING order past its window is left to the expiry
			// worker, which gives its unit back; the refusal takes nothing.
			outcome, ev.Reason = outcomeExpired, ReasonExpired
		case cur.Status == flashsale.OrderCancelled, cur.Status == flashsale.OrderRejected:
			outcome, ev.Reason = outcomeCancelled, ReasonCancelled
		case cur.Status == flashsale.OrderPaid:
			outcome, ev.Reason = outcomeDuplicate, ReasonDuplicate
		default:
			return fmt.Errorf("order %s in unknown status %q", cur.ID, cur.Status)
		}
		if err := events.Append(ctx, tx, ev); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO payments (payment_id, order_id, outcome, amount_cents, currency, created_at)
			VALUES ($1, $2, $3, $4, $5, $6)`, p.PaymentID, p.OrderID, outcome, p.AmountCents, p.Currency, now)
		return err
	})
	if errors.Is(err, errNotInDB) {
		return "", flashsale.Order{}, false, nil
	}
	if err != nil {
		return "", flashsale.Order{}, false, err
	}
	return outcome, o, found, nil
}

// errNotInDB rolls back a callback whose order is not in PostgreSQL.
var errNotInDB = errors.New("order not in the database")

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
