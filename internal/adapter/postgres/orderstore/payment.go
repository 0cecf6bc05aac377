package orderstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale"
)

// ErrReplayed is a payment callback signature that was recorded before.
var ErrReplayed = errors.New("orderstore: payment signature already recorded")

// paymentLockClass is the first key of the transaction-scoped advisory lock
// taken per payment id, so callbacks of one payment run one at a time
// (Migrate's lock is of the one-key form, which does not overlap).
const paymentLockClass = 18

// Payment is a provider's payment as the shop reports it, with the
// verified signature it came with.
type Payment struct {
	PaymentID, OrderID, Currency string
	AmountCents                  int64
	Signature                    string
	SignedAt                     time.Time
}

// Verdict is the answer the caller's policy gives a payment for the order
// as it stands: Pay makes it PAID; otherwise Reason is the refusal's, told
// in a payment.refused event. Outcome is what the payments table records.
type Verdict struct {
	Outcome string
	Pay     bool
	Reason  string
}

// PaymentResult is what RecordPayment committed. Found is false when the
// order is not in PostgreSQL (only the signature was recorded); Paid is
// the order this call paid; OtherOrder is a payment id recorded for
// another order (only the signature was recorded). Outcome is the
// payment's recorded outcome otherwise.
type PaymentResult struct {
	Outcome    string
	Paid       flashsale.Order
	Found      bool
	OtherOrder bool
}

// paymentEventSQL is a payment's event: order.paid (the shop's paid) or
// payment.refused (the shop's refused), with the payment id.
var paymentEventSQL = `WITH p AS (SELECT $1::uuid AS id, $3::int8 AS sale_id, $4::int8 AS item_id, $5::int8 AS user_id,
	$6::int8 AS price_cents, $7::text AS status, $8::text AS payment_id, NULLIF($9::text, '') AS reason)
` + eventsSQL("p", "$2::text", "$10::timestamptz", "n.status", "n.payment_id", "n.reason")

// RecordPayment records a provider's payment idempotently by payment id,
// in one transaction: the signature first when spend is set (ErrReplayed
// when it was recorded before); then, for a payment id seen before, its
// recorded outcome; for an order in PostgreSQL, decide's verdict on it
// (cur, and its item's currency), the shop's paid (the order PAID with its
// order.paid event) or the shop's refused (a payment.refused event, nothing
// else changed), and the payment row.
func (s *Store) RecordPayment(ctx context.Context, p Payment, now time.Time, spend bool,
	decide func(cur flashsale.Order, currency string) (Verdict, error)) (r PaymentResult, err error) {
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
		err := tx.QueryRow(ctx, `SELECT order_id::text, outcome FROM payments WHERE payment_id = $1`, p.PaymentID).Scan(&prevOrder, &r.Outcome)
		switch {
		case err == nil && prevOrder != p.OrderID:
			r.Found, r.OtherOrder = true, true
			return nil
		case err == nil:
			r.Found = true
			return nil // the recorded answer; only the signature is new
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		cur, ok, err := one(tx.QueryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE id = $1 FOR UPDATE`, p.OrderID), now)
		if err != nil || !ok {
			return err // no order: the signature alone
		}
		r.Found = true
		var currency string
		if err := tx.QueryRow(ctx, `SELECT currency FROM items WHERE id = $1`, cur.ItemID).Scan(&currency); err != nil {
			return fmt.Errorf("item %d of order %s: %w", cur.ItemID, cur.ID, err)
		}
		v, err := decide(cur, currency)
		if err != nil {
			return err
		}
		r.Outcome = v.Outcome
		if v.Pay {
			r.Paid, err = shopPaid(ctx, tx, cur, p, now)
		} else {
			err = shopRefused(ctx, tx, cur, p, v.Reason, now)
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO payments (payment_id, order_id, outcome, amount_cents, currency, created_at)
			VALUES ($1, $2, $3, $4, $5, $6)`, p.PaymentID, p.OrderID, v.Outcome, p.AmountCents, p.Currency, now)
		return err
	})
	if err != nil {
		return PaymentResult{}, err
	}
	return r, nil
}

// shopPaid is the shop's paid: the order, locked and PENDING, becomes PAID
// with its order.paid event.
func shopPaid(ctx context.Context, tx pgx.Tx, cur flashsale.Order, p Payment, now time.Time) (flashsale.Order, error) {
	if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'PAID', paid_at = $2, updated_at = now() WHERE id = $1`, cur.ID, now); err != nil {
		return flashsale.Order{}, err
	}
	cur.Status, cur.Payable = flashsale.OrderPaid, false
	_, err := tx.Exec(ctx, paymentEventSQL, cur.ID, "order.paid", cur.SaleID, cur.ItemID, cur.UserID, cur.PriceCents,
		string(flashsale.OrderPaid), p.PaymentID, "", now.UTC())
	return cur, err
}

// shopRefused is the shop's refused: nothing of the order changes; its
// payment.refused event tells the shop to refund.
func shopRefused(ctx context.Context, tx pgx.Tx, cur flashsale.Order, p Payment, reason string, now time.Time) error {
	_, err := tx.Exec(ctx, paymentEventSQL, cur.ID, "payment.refused", cur.SaleID, cur.ItemID, cur.UserID, cur.PriceCents,
		string(cur.Status), p.PaymentID, reason, now.UTC())
	return err
}

// SpendSignature records a verified callback signature alone, so it is
// never accepted again: ErrReplayed when it already was.
func (s *Store) SpendSignature(ctx context.Context, sig string, signedAt time.Time) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return recordSignature(ctx, tx, sig, signedAt)
	})
}

// recordSignature inserts a verified signature: ErrReplayed when it is
// there already. A concurrent copy waits on the key for the first one's
// commit, then finds its row.
func recordSignature(ctx context.Context, tx pgx.Tx, sig string, signedAt time.Time) error {
	tag, err := tx.Exec(ctx, `INSERT INTO payment_signatures (signature, signed_at) VALUES ($1, $2)
		ON CONFLICT (signature) DO NOTHING`, sig, signedAt)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrReplayed
	}
	return nil
}

// ForgetSignatures deletes up to 100 signatures signed before before; rows
// another callback is deleting are skipped.
func (s *Store) ForgetSignatures(ctx context.Context, before time.Time) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM payment_signatures WHERE signature IN (
		SELECT signature FROM payment_signatures WHERE signed_at < $1 LIMIT 100 FOR UPDATE SKIP LOCKED)`, before)
	return err
}
