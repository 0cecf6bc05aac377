// Package flashsale holds the domain types shared by every component of the
// flash-sale system: sales, items, orders, admissions and the messages that
// travel between components. It imports nothing from this module.
package flashsale

import (
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// SaleState is the public state of a sale (CONTRACT section 4).
type SaleState string

// Sale states.
const (
	SaleScheduled SaleState = "SCHEDULED"
	SaleOpen      SaleState = "OPEN"
	SaleSoldOut   SaleState = "SOLD_OUT"
	SaleEnded     SaleState = "ENDED"
	// SalePaused: an operator paused the sale (the kill switch): nobody is
	// admitted and purchases are refused until it is resumed.
	SalePaused SaleState = "PAUSED"
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
	// Allocation decides who buys (AllocationRace or AllocationQueue).
	// A sale created without one is queue (sales.Create); "" read back
	// is race, the rule of sales made before the setting. ClaimWindow is
	// how long a unit stays held for a shopper in queue order (0: the
	// default). Both are fixed when the sale is created.
	Allocation  string
	ClaimWindow time.Duration
	Items       []Item
	// Version is 1 at creation and grows by one on every change of the
	// sale (update, pause, resume, end, stock, message): an operator's
	// write that names a version (If-Match) applies only to that one.
	Version int64
	// Paused is the kill switch: no admission, no purchase.
	Paused bool
	// Message is the operator's note to everyone in the queue ("" none)
	// and MessageAt when it was set.
	Message   string
	MessageAt time.Time
	// Access is who may join the queue, and from when (the zero value:
	// anyone, any time).
	Access SaleAccess
}

// Allocations of a sale.
const (
	// AllocationRace: admitted shoppers (a first wave of remaining stock ×
	// the capacity factor, then the rate) race for the units; the
	// fastest purchase wins.
	AllocationRace = "race"
	// AllocationQueue: at each shopper's turn one unit is held for them
	// for the claim window; their purchase within it always reserves, and
	// an unused hold goes to the next in line.
	AllocationQueue = "queue"
)

// Bounds and default of Sale.ClaimWindow.
const (
	DefaultClaimWindow = 2 * time.Minute
	MinClaimWindow     = 10 * time.Second
	MaxClaimWindow     = time.Hour
)

// QueueOrder reports whether the sale is allocated in queue order.
func (s *Sale) QueueOrder() bool { return s.Allocation == AllocationQueue }

// Window is the sale's claim window (ClaimWindow, or the default).
func (s *Sale) Window() time.Duration {
	if s.ClaimWindow <= 0 {
		return DefaultClaimWindow
	}
	return s.ClaimWindow
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

// Ended reports whether the sale has ended at now.
func (s *Sale) Ended(now time.Time) bool { return !s.EndsAt.IsZero() && !now.Before(s.EndsAt) }

// State is the sale's state at now, given whether every item is sold out.
// An end comes first (a sale ended before its start, by the operator's end,
// is ENDED), then the pause.
func (s *Sale) State(now time.Time, allSoldOut bool) SaleState {
	switch {
	case s.Ended(now):
		return SaleEnded
	case s.Paused:
		return SalePaused
	case now.Before(s.StartsAt):
		return SaleScheduled
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
	MaxItemNameLen = 200  // bytes
	MaxImageURLLen = 2048 // bytes
	// MaxMessageLen bounds an operator's message to the queue, in
	// characters: a short note, shown on a phone.
	MaxMessageLen = 280
	// MaxStockAdd bounds the units one stock addition may add.
	MaxStockAdd = 1_000_000
	// DefaultCurrency is an item's currency when none is given.
	DefaultCurrency = "USD"
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
// An allocation is "", AllocationRace or AllocationQueue, a claim window 0
// (the default) or whole seconds from MinClaimWindow to MaxClaimWindow.
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
	case s.Allocation != "" && s.Allocation != AllocationRace && s.Allocation != AllocationQueue:
		return Invalid("allocation", "must be %q or %q", AllocationQueue, AllocationRace)
	case s.ClaimWindow != 0 && (s.ClaimWindow < MinClaimWindow || s.ClaimWindow > MaxClaimWindow ||
		s.ClaimWindow%time.Second != 0):
		return Invalid("claimWindowSeconds", "must be %d to %d seconds", int(MinClaimWindow/time.Second), int(MaxClaimWindow/time.Second))
	case len(s.Items) == 0:
		return Invalid("items", "at least one item required")
	case len(s.Items) > MaxSaleItems:
		return Invalid("items", "at most %d items", MaxSaleItems)
	}
	if err := s.Access.Validate(); err != nil {
		return err
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
		if err := it.validateDetails(field); err != nil {
			return err
		}
	}
	return nil
}

// validateDetails checks what shoppers see of an item: a name of at most
// MaxItemNameLen bytes, not blank ("" takes the default), an image URL
// that is absolute http(s) or a path of this site, and an ISO 4217 code.
func (it *Item) validateDetails(field func(string) string) error {
	switch {
	case it.Name != "" && strings.TrimSpace(it.Name) == "":
		return Invalid(field("name"), "must not be blank")
	case len(it.Name) > MaxItemNameLen:
		return Invalid(field("name"), "at most %d bytes", MaxItemNameLen)
	case !utf8.ValidString(it.Name) || hasControl(it.Name):
		return Invalid(field("name"), "must be UTF-8 text without control characters")
	case len(it.ImageURL) > MaxImageURLLen:
		return Invalid(field("imageUrl"), "at most %d bytes", MaxImageURLLen)
	case it.ImageURL != "" && !validImageURL(it.ImageURL):
		return Invalid(field("imageUrl"), "must be an absolute https:// URL or a path starting with / (the pages load no other pictures)")
	case it.Currency != "" && !ValidCurrency(it.Currency):
		return Invalid(field("currency"), "must be an ISO 4217 code (three upper-case letters)")
	}
	return nil
}

// ValidCurrency reports whether c has the form of an ISO 4217 code.
func ValidCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := range 3 {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

// validImageURL: a path of this site ("/assets/x.svg", not "//host",
// which is another host) or an absolute https URL with a host; no spaces
// or control characters, which a page would have to escape. The pages'
// Content-Security-Policy (img-src 'self' https:) loads nothing else.
func validImageURL(u string) bool {
	for i := 0; i < len(u); i++ {
		if u[i] <= ' ' || u[i] == 0x7f {
			return false
		}
	}
	if !utf8.ValidString(u) {
		return false
	}
	if strings.HasPrefix(u, "/") {
		return !strings.HasPrefix(u, "//") && !strings.HasPrefix(u, "/\\")
	}
	p, err := url.Parse(u)
	if err != nil {
		return false
	}
	return p.Scheme == "https" && p.Host != "" && p.User == nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return true
		}
	}
	return false
}

// WithDefaults fills what a creation may leave out: an item's name
// ("Product <productId>") and currency (DefaultCurrency).
func (it Item) WithDefaults() Item {
	if it.Name == "" {
		it.Name = fmt.Sprintf("Product %d", it.ProductID)
	}
	if it.Currency == "" {
		it.Currency = DefaultCurrency
	}
	return it
}

// ParseMessage checks an operator's message to the queue: trimmed, valid
// UTF-8 without control characters, at most MaxMessageLen characters; ""
// clears the message.
func ParseMessage(text string) (string, error) {
	text = strings.TrimSpace(text)
	switch {
	case !utf8.ValidString(text) || hasControl(text):
		return "", Invalid("text", "must be UTF-8 text without control characters")
	case utf8.RuneCountInString(text) > MaxMessageLen:
		return "", Invalid("text", "at most %d characters", MaxMessageLen)
	}
	return text, nil
}

// Item is one product on sale with a fixed quantity and price.
type Item struct {
	ID         int64
	SaleID     int64
	ProductID  int64
	Quantity   int64
	PriceCents int64
	// Name, ImageURL and Currency are what shoppers see (Validate's
	// rules; WithDefaults fills a missing name and currency).
	Name     string
	ImageURL string
	Currency string
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
// sale from NotBefore (when set) until ExpiresAt.
type Admission struct {
	UserID    int64
	SaleID    int64
	ExpiresAt time.Time
	// NotBefore, when set, is the instant from which the admission buys:
	// the first wave is admitted before the opening with NotBefore at it.
	NotBefore time.Time
}

// Turn is one shopper's turn in a sale, as the sale's leader saw it come:
// Place is the shopper's place in the sale's order, counted from 0 (the
// numbering of the draw record).
type Turn struct {
	UserID int64
	Place  int64
}

// TurnKind is how a turn came.
type TurnKind string

const (
	// TurnAdmitted: the cursor of a sale allocated in race order passed
	// the place; the shopper may buy.
	TurnAdmitted TurnKind = "admitted"
	// TurnHeld: a sale allocated in queue order held a unit for the place;
	// the shopper may pay for it.
	TurnHeld TurnKind = "held"
)

// Principal is the caller identified by an access token.
type Principal struct {
	UserID   int64
	Operator bool
	// IdentityKey is the shop's identity key for the person (the access
	// token's idk claim: its hash of a card, an address or a phone; never
	// the raw value), "" when the token carries none. A sale's queue holds
	// one place per key, across user ids.
	IdentityKey string
	// Risk is the shop's risk score of the session (the access token's
	// risk claim, 0 to 1; 0 when the token carries none). The bot
	// defense may shadow joins above a threshold (shadowQueue.riskAbove).
	Risk float64
	// Tier is the access token's tier claim (1 first, up to MaxTier), 0
	// when it has none or when its signer is not trusted to assert one
	// (auth.WithTierSigners): a sale's access rule reads it.
	Tier int
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
	Actor string
	// IfVersion, when not 0, is the version the operator saw (If-Match):
	// the change applies only while the sale is at it (VERSION_CONFLICT
	// otherwise).
	IfVersion              int64
	Name                   *string
	AdmissionRatePerSecond *int
	EndsAt                 *time.Time
	Access                 *SaleAccess
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

// RoomReport is the waiting room's part of a sale's report (GET
// /api/admin/sales/{id}/report), read from the gateways' per-minute
// roll-up in PostgreSQL. Minutes are in time order, one per minute from
// the first the room saw to the last, none left out.
type RoomReport struct {
	Joined   int64 `json:"joined"`   // shoppers given a place
	PreQueue int64 `json:"preQueue"` // places drawn at the opening; -1: not drawn yet
	Admitted int64 `json:"admitted"` // shoppers whose turn came
	Holds    int64 `json:"holds"`    // queue order: turns that came with a held unit
	Waiting  int64 `json:"waiting"`  // joined and not yet admitted
	// Wait is from a shopper's join to their admission, over every
	// shopper admitted on a WebSocket.
	Wait WaitFigures `json:"wait"`
	// Refusals are the joins refused, by rule; Shadowed the shoppers sent
	// to the shadow queue, by rule (they are not in Joined).
	Refusals map[string]int64 `json:"refusals"`
	Shadowed map[string]int64 `json:"shadowed"`
	Minutes  []RoomMinute     `json:"minutes"`
}

// RoomMinute is one minute of a RoomReport: the minute's new figures and
// the totals at its end.
type RoomMinute struct {
	At         time.Time        `json:"at"` // the minute's start
	Joins      int64            `json:"joins"`
	Joined     int64            `json:"joined"`
	PreQueue   int64            `json:"preQueue"`
	Admissions int64            `json:"admissions"`
	Admitted   int64            `json:"admitted"`
	Holds      int64            `json:"holds"`
	Waiting    int64            `json:"waiting"`
	Refusals   map[string]int64 `json:"refusals"`
	Shadowed   map[string]int64 `json:"shadowed"`
	Wait       WaitFigures      `json:"wait"`
}

// WaitFigures are percentiles of the wait from join to admission, in
// milliseconds, over Count shoppers (all 0 when Count is 0). Each is the
// upper bound of the histogram bucket the rank falls in, kept between the
// shortest and the longest wait seen.
type WaitFigures struct {
	Count int64 `json:"count"`
	MinMs int64 `json:"minMs"`
	P50Ms int64 `json:"p50Ms"`
	P90Ms int64 `json:"p90Ms"`
	P99Ms int64 `json:"p99Ms"`
	MaxMs int64 `json:"maxMs"`
}

// OrderReport is the orders' part of a sale's report, read from the
// orders. Sold counts live orders (PENDING and PAID: one unit each);
// Placed every order but REJECTED ones (the writer refused them);
// Conversion is Paid / Placed (0 when nothing was placed).
type OrderReport struct {
	ByStatus   map[OrderStatus]int64 `json:"byStatus"`
	Items      []ItemSold            `json:"items"`
	Sold       int64                 `json:"sold"`
	Placed     int64                 `json:"placed"`
	Paid       int64                 `json:"paid"`
	Conversion float64               `json:"paymentConversion"`
	// Minutes are the minutes in which an order was placed or paid, in
	// time order.
	Minutes []OrderMinute `json:"minutes"`
	// SellOut is the sell-out curve at a step fine enough for a drop
	// that sells out in a second.
	SellOut SellOut `json:"sellOut"`
}

// ItemSold is the units of one item sold (live orders) and paid.
// LastSoldAt is when the item's latest live order was placed (its
// reservation): for an item sold out, the moment it sold out; nil when
// nothing is sold.
type ItemSold struct {
	ItemID     int64      `json:"itemId"`
	Sold       int64      `json:"sold"`
	Paid       int64      `json:"paid"`
	LastSoldAt *time.Time `json:"lastSoldAt,omitempty"`
}

// SellOut is the live orders by when they were placed, per item, in
// steps of StepMs (the smallest of 100 ms, 250 ms, 500 ms, 1 s, 2 s,
// 5 s, 10 s, 30 s and whole minutes that keeps the curve within
// SellOutMaxSteps steps from the first order to the last). Points are
// the steps holding a live order, in time order; At is a step's start.
type SellOut struct {
	StepMs int64          `json:"stepMs"`
	Points []SellOutPoint `json:"points"`
}

// SellOutMaxSteps bounds a SellOut's span in steps.
const SellOutMaxSteps = 2000

// SellOutPoint is one step of a SellOut.
type SellOutPoint struct {
	At    time.Time    `json:"at"`
	Items []ItemMinute `json:"items"`
}

// OrderMinute is one minute of an OrderReport: per item, the orders
// placed in it that are still live (the sell-out curve), and the orders
// paid in it.
type OrderMinute struct {
	At    time.Time    `json:"at"`
	Items []ItemMinute `json:"items"`
	Sold  int64        `json:"sold"`
	Paid  int64        `json:"paid"`
}

// ItemMinute is one item's live orders placed in an OrderMinute or a
// SellOutPoint.
type ItemMinute struct {
	ItemID int64 `json:"itemId"`
	Sold   int64 `json:"sold"`
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
