// Package flashsale holds the domain types shared by every component of the
// flash-sale system: sales, items, orders, admissions and the messages that
// travel between components. It imports nothing from this module.
package flashsale

import (
	"encoding/hex"
	"time"
)

// SaleState is the public state of a sale (CONTRACT section 4).
type SaleState string

// Sale states.
const (
	SaleScheduled SaleState = "SCHEDULED"
	SaleOpen      SaleState = "OPEN"
	SaleSoldOut   SaleState = "SOLD_OUT"
	SaleEnded     SaleState = "ENDED"
)

// Sale is one flash sale: a start time, an admission rate and its items.
type Sale struct {
	ID                     int64
	Name                   string
	StartsAt               time.Time
	EndsAt                 time.Time // zero: no end other than selling out
	AdmissionRatePerSecond int
	// ShuffleSeed is the 32 random bytes that order the pre-queue. It is
	// secret until the sale opens; ShuffleCommitment is published from the
	// start and is the hex SHA-256 of ShuffleSeed.
	ShuffleSeed       []byte
	ShuffleCommitment string
	CreatedAt         time.Time
	// CreatedBy is who created the sale (the operator's user id), for the
	// audit log; it is not stored with the sale.
	CreatedBy string
	Items     []Item
}

// Open reports whether the sale has started at now (and has not ended).
func (s *Sale) Open(now time.Time) bool {
	if now.Before(s.StartsAt) {
		return false
	}
	return s.EndsAt.IsZero() || now.Before(s.EndsAt)
}

// State is the sale's state at now, given whether every item is sold out.
func (s *Sale) State(now time.Time, allSoldOut bool) SaleState {
	switch {
	case now.Before(s.StartsAt):
		return SaleScheduled
	case !s.EndsAt.IsZero() && !now.Before(s.EndsAt):
		return SaleEnded
	case allSoldOut:
		return SaleSoldOut
	default:
		return SaleOpen
	}
}

// SeedHex is the published form of the shuffle seed.
func (s *Sale) SeedHex() string { return hex.EncodeToString(s.ShuffleSeed) }

// Item returns the sale's item with the given id.
func (s *Sale) Item(id int64) (Item, bool) {
	for _, it := range s.Items {
		if it.ID == id {
			return it, true
		}
	}
	return Item{}, false
}

// Item is one product on sale with a fixed quantity and price.
type Item struct {
	ID         int64
	SaleID     int64
	ProductID  int64
	Quantity   int64
	PriceCents int64
}

// OrderStatus is the lifecycle state of an order.
type OrderStatus string

// Order statuses. PENDING and PAID are live: they hold a unit of stock.
const (
	OrderPending   OrderStatus = "PENDING"
	OrderPaid      OrderStatus = "PAID"
	OrderExpired   OrderStatus = "EXPIRED"
	OrderCancelled OrderStatus = "CANCELLED"
	OrderRejected  OrderStatus = "REJECTED"
)

// Live reports whether an order in this status holds stock.
func (s OrderStatus) Live() bool { return s == OrderPending || s == OrderPaid }

// Order is a reservation of one unit of one item by one user.
type Order struct {
	ID         string // UUID
	SaleID     int64
	ItemID     int64
	UserID     int64
	Status     OrderStatus
	PriceCents int64
	CreatedAt  time.Time
	ExpiresAt  time.Time
	// Payable is false while the order is accepted (in Redis and Kafka) but
	// not yet in PostgreSQL.
	Payable bool
}

// OrderPlaced is the message the purchase service publishes to Kafka after a
// successful reservation; the writer turns it into an order row.
type OrderPlaced struct {
	OrderID     string `json:"orderId"`
	SaleID      int64  `json:"saleId"`
	ItemID      int64  `json:"itemId"`
	UserID      int64  `json:"userId"`
	PriceCents  int64  `json:"priceCents"`
	CreatedAtMs int64  `json:"createdAtMs"`
}

// Admission is what an admission token asserts: this user may buy in this
// sale until ExpiresAt.
type Admission struct {
	UserID    int64
	SaleID    int64
	ExpiresAt time.Time
}

// Principal is the caller identified by an access token.
type Principal struct {
	UserID   int64
	Operator bool
}

// Kafka topics.
const (
	TopicOrders     = "flash-sale-orders"
	TopicDeadLetter = "flash-sale-orders-dlq"
)

// SaleUpdate is a live change to a running sale (PATCH /api/admin/sales/{id});
// nil fields stay as they are.
type SaleUpdate struct {
	// Actor is who asked (the operator's user id), for the audit log.
	Actor                  string
	Name                   *string
	AdmissionRatePerSecond *int
	EndsAt                 *time.Time
}

// ItemFigures are the live figures of one item (GET /api/admin/sales/{id}).
type ItemFigures struct {
	ItemID    int64
	Remaining int64 // Redis
	Sold      int64 // live orders: PENDING + PAID
	Paid      int64
	Expired   int64
	Cancelled int64
	Rejected  int64
}

// QueueFigures are the waiting room's figures of one sale.
type QueueFigures struct {
	Joined   int64 `json:"joined"`
	Admitted int64 `json:"admitted"`
	Waiting  int64 `json:"waiting"`
}
