// Package events is the order-event outbox: the events that tell a shop of
// every status change of an order, the Append that writes one in the
// caller's transaction, the Relay that publishes them to Kafka exactly
// once, and the webhook Deliverer that POSTs them to the shop.
//
// An event row is written in the same transaction as the change it tells
// of, so there is an event exactly when the change committed, and never one
// for a change that did not happen (a repeated pay, a lost race): callers
// append only after their guarded UPDATE or INSERT reported a row. The row
// id is the eventId; one order's changes are serialised by its row lock, so
// its events' ids increase in the order of the changes.
package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale"
)

// Version is the schema version of Event (its "version" field). A change
// that a consumer written for this version could misread gets a new
// version; added optional fields do not.
const Version = 1

// Type is the kind of an event.
type Type string

// Event types. Each order status has its event; payment.refused tells of a
// provider payment that came for an order that can no longer be paid, so the
// shop refunds it.
const (
	TypePending        Type = "order.pending"
	TypePaid           Type = "order.paid"
	TypeExpired        Type = "order.expired"
	TypeCancelled      Type = "order.cancelled"
	TypeRejected       Type = "order.rejected"
	TypePaymentRefused Type = "payment.refused"
)

// Valid reports whether t is a known event type.
func (t Type) Valid() bool {
	switch t {
	case TypePending, TypePaid, TypeExpired, TypeCancelled, TypeRejected, TypePaymentRefused:
		return true
	}
	return false
}

// TypeFor is the event of a change to status s ("" for an unknown status).
func TypeFor(s flashsale.OrderStatus) Type {
	switch s {
	case flashsale.OrderPending:
		return TypePending
	case flashsale.OrderPaid:
		return TypePaid
	case flashsale.OrderExpired:
		return TypeExpired
	case flashsale.OrderCancelled:
		return TypeCancelled
	case flashsale.OrderRejected:
		return TypeRejected
	}
	return ""
}

// Event is one order event as published (JSON schema version 1,
// docs/order-event.schema.json).
type Event struct {
	Version int `json:"version"`
	// EventID is the outbox row id: unique, increasing per order.
	EventID    int64     `json:"eventId"`
	Type       Type      `json:"type"`
	OccurredAt time.Time `json:"occurredAt"`
	OrderID    string    `json:"orderId"`
	SaleID     int64     `json:"saleId"`
	ItemID     int64     `json:"itemId"`
	// UserID is a JSON string so that shops whose user ids are not numbers
	// keep one type.
	UserID int64                 `json:"userId,string"`
	Status flashsale.OrderStatus `json:"status"`
	// PriceCents is the order's price.
	PriceCents int64 `json:"priceCents"`
	// PaymentID is the provider's payment id (payment events only).
	PaymentID string `json:"paymentId,omitempty"`
	// Reason is why (order.rejected and payment.refused only).
	Reason string `json:"reason,omitempty"`
}

// appendSQL draws the row id first so that the body, built by the
// migration's flashsale_order_event_body (the one definition of the JSON
// shape), carries it as eventId.
const appendSQL = `INSERT INTO order_events (id, order_id, type, body)
SELECT n.id, $1::uuid, $2::text,
	flashsale_order_event_body(n.id, $2::text, $3::timestamptz, $1::uuid, $4::int8, $5::int8, $6::int8, $7::text, $8::int8,
		NULLIF($9::text, ''), NULLIF($10::text, ''))
FROM (SELECT nextval('order_events_id_seq') AS id) n`

var errInvalid = errors.New("invalid event")

// Append inserts ev into the outbox in the caller's transaction. Version
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
	case ev.Type == TypePaymentRefused && ev.PaymentID == "":
		return fmt.Errorf("%w: payment.refused without paymentId", errInvalid)
	}
	if len(ev.OrderID) != 36 {
		return fmt.Errorf("%w: orderId is not a UUID", errInvalid)
	}
	if _, err := uuid.Parse(ev.OrderID); err != nil {
		return fmt.Errorf("%w: orderId: %w", errInvalid, err)
	}
	return nil
}
