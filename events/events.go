// Package events is the order-event outbox's far side: the events that
// tell a shop of every status change of an order, the Relay that publishes
// them to Kafka exactly once, and the webhook Deliverer that POSTs them to
// the shop. It also owns the shopper-event outbox: Shoppers writes the
// turns the sale leaders report (shopper.admitted), off their ticks, and
// the Deliverer POSTs them too; they are not published to Kafka.
//
// The order store (internal/adapter/postgres/orderstore) writes every
// event row, in the same statement or transaction as the change it tells
// of, so there is an event exactly when the change committed, and never one
// for a change that did not happen (a repeated pay, a lost race). The row
// id is the eventId; one order's changes are serialised by its row lock, so
// its events' ids increase in the order of the changes. This package only
// reads and marks the order event rows.
package events

import (
	"time"

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
