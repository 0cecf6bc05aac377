package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// appendSQL draws the row id first so that the body, built by the
// migration's flashsale_order_event_body (the one definition of the JSON
// shape), carries it as eventId.
const appendSQL = `INSERT INTO order_events (id, order_id, type, body)
SELECT n.id, $1::uuid, $2::text,
	flashsale_order_event_body(n.id, $2::text, $3::timestamptz, $1::uuid, $4::int8, $5::int8, $6::int8, $7::text, $8::int8,
		NULLIF($9::text, ''), NULLIF($10::text, ''))
FROM (SELECT nextval('order_events_id_seq') AS id) n`

var errInvalid = errors.New("invalid event")

// Append is the tests' way to seed the outbox with an event, outside any
// order change (the order store writes the events of real changes): it
// inserts ev in the caller's transaction. Version
// and EventID are assigned (ev's are ignored); OccurredAt must be set (the
// caller's clock) and is stored in UTC to the microsecond.
func Append(ctx context.Context, tx pgx.Tx, ev Event) error {
	if err := check(ev); err != nil {
		return fmt.Errorf("events.Append: %w", err)
	}
	_, err := tx.Exec(ctx, appendSQL, ev.OrderID, string(ev.Type), ev.OccurredAt.UTC(), ev.SaleID, ev.ItemID,
		ev.UserID, string(ev.Status), ev.PriceCents, ev.PaymentID, ev.Reason)
	if err != nil {
		return fmt.Errorf("events.Append: %w", err)
	}
	return nil
}

// check refuses an event no consumer could use.
func check(ev Event) error {
	switch {
	case !ev.Type.Valid():
		return fmt.Errorf("%w: unknown type %q", errInvalid, ev.Type)
	case ev.OccurredAt.IsZero():
		return fmt.Errorf("%w: occurredAt not set", errInvalid)
	case ev.SaleID <= 0 || ev.ItemID <= 0 || ev.UserID <= 0:
		return fmt.Errorf("%w: saleId, itemId and userId must be positive", errInvalid)
	case ev.PriceCents < 0:
		return fmt.Errorf("%w: negative priceCents", errInvalid)
	case TypeFor(ev.Status) == "":
		return fmt.Errorf("%w: unknown status %q", errInvalid, ev.Status)
	case ev.Type != TypePaymentRefused && TypeFor(ev.Status) != ev.Type:
		return fmt.Errorf("%w: type %s with status %s", errInvalid, ev.Type, ev.Status)
	case ev.Type == TypePaymentRefused && (ev.PaymentID == "" || ev.Reason == ""):
		return fmt.Errorf("%w: payment.refused needs a paymentId and a reason", errInvalid)
	}
	if len(ev.OrderID) != 36 {
		return fmt.Errorf("%w: orderId is not a UUID", errInvalid)
	}
	if _, err := uuid.Parse(ev.OrderID); err != nil {
		return fmt.Errorf("%w: orderId: %w", errInvalid, err)
	}
	return nil
}
