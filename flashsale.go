// Package flashsale holds the domain types shared by every component of the
// flash-sale system: sales, items, orders, admissions and the messages that
// travel between components. It imports nothing from this module.
package flashsale

import (
	"encoding/hex"
	"fmt"
	"strings"
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
	// StockShards is how many shards each item's stock is split over in
	// Redis, each in a hash slot of its own, so that a hot sale's
	// reservations spread over a cluster's masters (0 means 1; see
	// internal/adapter/redisstock). It is fixed when the sale is created.
	StockShards int
	Items       []Item
}

// Shards is the number of stock shards of the sale (StockShards, at least 1).
func (s *Sale) Shards() int { return max(s.StockShards, 1) }

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

// Limits of a sale, the same at every entry that creates one.
const (
	MaxSaleNameLen = 200  // bytes
	MaxSaleItems   = 1000 // items in one sale
	// MaxStockShards bounds Sale.StockShards: a reservation on a dry home
	// shard may ask each other shard in turn.
	MaxStockShards = 16
)

// Validate checks a sale before it is created: a name, a start, an end (if
// any) after the start, an admission rate of at least 1, a stock shard
// count of 0 (the default, 1) to MaxStockShards, and 1 to
// MaxSaleItems items, each with a product id and quantity of at least 1 and
// a price of 0 or more. It returns the first fault as an INVALID *Error whose
// message begins with the field as the operator API names it
// ("items[2].quantity"), so every entry (HTTP, App.CreateSale, the load
// tool) refuses the same sales with the same words. The name's length counts
// any surrounding spaces: a caller that trims does so after validating.
func (s *Sale) Validate() error {
	switch {
	case strings.TrimSpace(s.Name) == "":
		return Invalid("name", "required")
	case len(s.Name) > MaxSaleNameLen:
		return Invalid("name", "at most %d bytes", MaxSaleNameLen)
	case s.StartsAt.IsZero():
		return Invalid("startsAt", "required (RFC 3339 time)")
	case !s.EndsAt.IsZero() && !s.EndsAt.After(s.StartsAt):
		return Invalid("endsAt", "must be after startsAt")
	case s.AdmissionRatePerSecond < 1:
		return Invalid("admissionRatePerSecond", "must be at least 1")
	case s.StockShards < 0 || s.StockShards > MaxStockShards:
		return Invalid("stockShards", "must be 1 to %d", MaxStockShards)
	case len(s.Items) == 0:
		return Invalid("items", "at least one item required")
	case len(s.Items) > MaxSaleItems:
		return Invalid("items", "at most %d items", MaxSaleItems)
	}
	for i, it := range s.Items {
		field := func(name string) string { return fmt.Sprintf("items[%d].%s", i, name) }
		switch {
		case it.ProductID < 1:
			return Invalid(field("productId"), "must be at least 1")
		case it.Quantity < 1:
			return Invalid(field("quantity"), "must be at least 1")
		case it.PriceCents < 0:
			return Invalid(field("priceCents"), "must be 0 or more")
		}
	}
	return nil
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
	// TopicOrderEvents carries the order events (package events), keyed
	// by order id.
	TopicOrderEvents = "flash-sale-order-events"
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

// ShopPayment is a payment the shop's provider reports for an order
// (POST /api/shop/orders/{orderId}/paid). The gateway has checked its
// signature's MAC and age; Signature (the header's t and v1, as sent) is
// what a replay would repeat.
type ShopPayment struct {
	OrderID     string
	PaymentID   string
	AmountCents int64
	Currency    string // "" when the provider sent none
	Signature   string
	SignedAt    time.Time
}
