package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/conn/split"
)

// orderJSON is the contract's order object.
type orderJSON struct {
	OrderID    string `json:"orderId"`
	SaleID     int64  `json:"saleId"`
	ItemID     int64  `json:"itemId"`
	Status     string `json:"status"`
	Payable    bool   `json:"payable"`
	PriceCents int64  `json:"priceCents"`
	CreatedAt  string `json:"createdAt"`
	ExpiresAt  string `json:"expiresAt"`
	// PaymentURL is the shop's payment page of a payable order, when
	// Config.PaymentURL is set.
	PaymentURL string `json:"paymentUrl,omitempty"`
	// Currency is the item's (ISO 4217), when the sale is in the cache.
	Currency string `json:"currency,omitempty"`
}

func toOrderJSON(o flashsale.Order) orderJSON {
	return orderJSON{
		OrderID:    o.ID,
		SaleID:     o.SaleID,
		ItemID:     o.ItemID,
		Status:     string(o.Status),
		Payable:    o.Payable,
		PriceCents: o.PriceCents,
		CreatedAt:  fmtTime(o.CreatedAt),
		ExpiresAt:  fmtTime(o.ExpiresAt),
	}
}

// orderView is the order object of o as the shopper sees it, with the
// shop's payment page while it can be paid there.
func (s *Server) orderView(o flashsale.Order) orderJSON {
	j := toOrderJSON(o)
	if _, it, ok := s.d.Sales.ItemSale(o.ItemID); ok {
		j.Currency = it.Currency
	}
	if o.Payable {
		j.PaymentURL = s.paymentURL(o.ID)
	}
	return j
}

// fmtTime is RFC 3339 in UTC ("" for the zero time).
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// userRoute runs the Guard (class read) and access-token checks of a
// shopper route.
func (s *Server) userRoute(c *fiber.Ctx) (flashsale.Principal, bool) {
	p, _, ok := s.guarded(c, ClassRead)
	return p, ok
}

func (s *Server) orderAction(c *fiber.Ctx, do func(ctx context.Context, userID int64, orderID string) (flashsale.Order, error)) error {
	s.countSaleRequest()
	p, ok := s.userRoute(c)
	if !ok {
		return nil
	}
	id, ok := parseUUID(c.Params("orderId"))
	if !ok {
		return errBadOrderID
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	o, err := do(ctx, p.UserID, id)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(s.orderView(o))
}

// orderGet is GET /api/flash-sales/orders/{orderId}.
func (s *Server) orderGet(c *fiber.Ctx) error { return s.orderAction(c, s.d.Orders.Get) }

// orderPay is POST /api/flash-sales/orders/{orderId}/pay; the optional body
// {"paymentToken": "..."} is checked for form and otherwise unused.
func (s *Server) orderPay(c *fiber.Ctx) error {
	return s.orderAction(c, func(ctx context.Context, userID int64, orderID string) (flashsale.Order, error) {
		if s.cfg.PaymentURL != "" {
			return flashsale.Order{}, errPayOnShop
		}
		if body := bytes.TrimSpace(c.Body()); len(body) > 0 {
			var req struct {
				PaymentToken string `json:"paymentToken"`
			}
			if err := decodeStrict(body, &req); err != nil {
				return flashsale.Order{}, err
			}
		}
		return s.d.Orders.Pay(ctx, userID, orderID)
	})
}

// orderCancel is POST /api/flash-sales/orders/{orderId}/cancel.
func (s *Server) orderCancel(c *fiber.Ctx) error { return s.orderAction(c, s.d.Orders.Cancel) }

// saleOrder is GET /api/flash-sales/sales/{saleId}/order: the caller's
// order in the sale.
func (s *Server) saleOrder(c *fiber.Ctx) error {
	p, ok := s.userRoute(c)
	if !ok {
		return nil
	}
	saleID, ok := parseID(c.Params("saleId"))
	if !ok {
		return errBadSaleID
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	o, err := s.d.Orders.BySale(ctx, p.UserID, saleID)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(s.orderView(o))
}

// maxCodeLen bounds an invitation code in a join (as the waiting room's
// WebSocket join does).
const maxCodeLen = 64

// queueJoin is POST /api/flash-sales/sales/{saleId}/queue, the polling
// join; the body may carry {"pow": {...}, "code": "..."}.
func (s *Server) queueJoin(c *fiber.Ctx) error {
	saleID, idOK := parseID(c.Params("saleId"))
	p, ip, ok := s.guardedJoin(c, ClassJoin, saleID)
	if !ok {
		return nil
	}
	if !idOK {
		return errBadSaleID
	}
	var req struct {
		PoW  json.RawMessage `json:"pow"`
		Code *string         `json:"code"`
	}
	if body := bytes.TrimSpace(c.Body()); len(body) > 0 {
		if err := decodeStrict(body, &req); err != nil {
			return err
		}
		if bytes.Equal(req.PoW, []byte("null")) {
			req.PoW = nil
		}
		if req.Code != nil && (*req.Code == "" || len(*req.Code) > maxCodeLen) {
			return flashsale.Invalid("code", "1 to %d characters (leave it out for none)", maxCodeLen)
		}
	}
	var code string
	if req.Code != nil {
		code = *req.Code
	}
	if _, ok := s.d.Sales.Sale(saleID); !ok {
		return errNoSale
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	st, err := s.d.Queue.Join(ctx, p, saleID, ip, req.PoW, code)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(st)
}

// queueStatus is GET /api/flash-sales/sales/{saleId}/queue without Upgrade.
// With ?itemId=N (queue order) it first records the caller's choice of
// item, and a refused choice is the answer. An upgrade that reaches fiber
// (a reused keep-alive connection) is handed to the WebSocket server.
func (s *Server) queueStatus(c *fiber.Ctx) error {
	if split.HasWebSocketToken([]byte(c.Get(fiber.HeaderUpgrade))) {
		return s.forwardUpgrade(c)
	}
	p, ok := s.userRoute(c)
	if !ok {
		return nil
	}
	saleID, ok := parseID(c.Params("saleId"))
	if !ok {
		return errBadSaleID
	}
	item, choose, err := parseItemQuery(c.Context().QueryArgs().QueryString())
	if err != nil {
		return err
	}
	if _, ok := s.d.Sales.Sale(saleID); !ok {
		return errNoSale
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	if choose {
		if err := s.d.Queue.Choose(ctx, p, saleID, item); err != nil {
			return err
		}
	}
	st, err := s.d.Queue.Status(ctx, p, saleID)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(st)
}

// publicSaleJSON is the public sale page data (CONTRACT section 4).
type publicSaleJSON struct {
	ID                int64  `json:"id"`
	Name              string `json:"name"`
	StartsAt          string `json:"startsAt"`
	EndsAt            string `json:"endsAt,omitempty"`
	ServerTimeMs      int64  `json:"serverTimeMs"`
	State             string `json:"state"`
	ShuffleCommitment string `json:"shuffleCommitment"`
	ShuffleSeed       string `json:"shuffleSeed,omitempty"`
	// Allocation is "queue" for a sale allocated in queue order (its
	// shoppers choose an item while they wait); absent for a race.
	Allocation string       `json:"allocation,omitempty"`
	Message    *messageJSON `json:"message,omitempty"`
	// Access is the sale's access rule, absent for a plain open sale:
	// the page asks for a code when its rule is "codes".
	Access *flashsale.SaleAccess `json:"access,omitempty"`
	Items  []publicItemJSON      `json:"items"`
}

type publicItemJSON struct {
	ID         int64  `json:"id"`
	ProductID  int64  `json:"productId"`
	Name       string `json:"name"`
	ImageURL   string `json:"imageUrl,omitempty"`
	Currency   string `json:"currency"`
	PriceCents int64  `json:"priceCents"`
	SoldOut    bool   `json:"soldOut"`
}

// soldOutFlags is whether each item of sale is sold out: the local flag, or
// no stock left in the (per-second cached) remaining figures.
func (s *Server) soldOutFlags(sale *flashsale.Sale, now time.Time) ([]bool, bool) {
	rem := s.remaining(sale.ID, now)
	flags := make([]bool, len(sale.Items))
	all := len(sale.Items) > 0
	for i, it := range sale.Items {
		n, known := rem[it.ID]
		flags[i] = s.d.Purchase.SoldOut(it.ID) || (known && n <= 0)
		all = all && flags[i]
	}
	return flags, all
}

func (s *Server) publicView(sale *flashsale.Sale, now time.Time) publicSaleJSON {
	flags, all := s.soldOutFlags(sale, now)
	v := publicSaleJSON{
		ID:                sale.ID,
		Name:              sale.Name,
		StartsAt:          fmtTime(sale.StartsAt),
		EndsAt:            fmtTime(sale.EndsAt),
		ServerTimeMs:      now.UnixMilli(),
		State:             string(sale.State(now, all)),
		ShuffleCommitment: sale.ShuffleCommitment,
		Message:           saleMessage(sale),
		Items:             make([]publicItemJSON, len(sale.Items)),
	}
	if sale.QueueOrder() {
		v.Allocation = flashsale.AllocationQueue
	}
	if !sale.Access.Plain() {
		a := sale.Access
		v.Access = &a
	}
	if s.seedPublic(sale, now) {
		v.ShuffleSeed = sale.SeedHex()
	}
	for i, it := range sale.Items {
		v.Items[i] = publicItemJSON{ID: it.ID, ProductID: it.ProductID, Name: it.Name, ImageURL: it.ImageURL, Currency: it.Currency,
			PriceCents: it.PriceCents, SoldOut: flags[i]}
	}
	return v
}

// pathSale runs the address checks of a public sale route and finds the
// sale its path names. ok is false when the request is answered already
// (by the checks: err nil) or is to be answered with err.
func (s *Server) pathSale(c *fiber.Ctx) (sale *flashsale.Sale, now time.Time, ok bool, err error) {
	now = s.reqNow(c)
	if _, ok := s.checkAddr(c, ClassRead, now); !ok {
		return nil, now, false, nil
	}
	saleID, ok := parseID(c.Params("saleId"))
	if !ok {
		return nil, now, false, errBadSaleID
	}
	sale, ok = s.d.Sales.Sale(saleID)
	if !ok {
		return nil, now, false, errNoSale
	}
	return sale, now, true, nil
}

// publicSale is GET /api/flash-sales/sales/{saleId}.
func (s *Server) publicSale(c *fiber.Ctx) error {
	sale, now, ok, err := s.pathSale(c)
	if !ok {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "public, max-age=1")
	return c.JSON(s.publicView(sale, now))
}

// publicSales is GET /api/flash-sales/sales: every sale not yet ended, as
// an array of public sale objects.
func (s *Server) publicSales(c *fiber.Ctx) error {
	now := s.reqNow(c)
	if _, ok := s.checkAddr(c, ClassRead, now); !ok {
		return nil
	}
	sales, err := s.list.get(now, s.listSales)
	if err != nil {
		return err
	}
	out := make([]publicSaleJSON, 0, len(sales))
	for i := range sales {
		v := s.publicView(&sales[i], now)
		if v.State == string(flashsale.SaleEnded) {
			continue
		}
		out = append(out, v)
	}
	c.Set(fiber.HeaderCacheControl, "public, max-age=1")
	return c.JSON(out)
}

func (s *Server) listSales() ([]flashsale.Sale, error) {
	ctx, cancel := s.reqCtx()
	defer cancel()
	return s.d.SaleAdmin.List(ctx)
}

// remainingCache keeps each sale's remaining stock for a second, so the
// hammered public page costs at most one Redis call per sale per second.
// While one request refreshes an entry, others use the stale figures.
type remainingCache struct {
	mu sync.Mutex
	m  map[int64]*remainingEntry
}

type remainingEntry struct {
	at       time.Time
	rem      map[int64]int64
	fetching bool
}

func (s *Server) remaining(saleID int64, now time.Time) map[int64]int64 {
	if s.d.Stock == nil {
		return nil
	}
	rc := &s.remain
	rc.mu.Lock()
	e := rc.m[saleID]
	if e == nil {
		e = &remainingEntry{}
		rc.m[saleID] = e
	}
	if e.fetching || (e.rem != nil && now.Sub(e.at) < time.Second && !now.Before(e.at)) {
		rem := e.rem
		rc.mu.Unlock()
		return rem
	}
	e.fetching = true
	stale := e.rem
	rc.mu.Unlock()

	ctx, cancel := s.reqCtx()
	rem, err := s.d.Stock.Remaining(ctx, saleID)
	cancel()

	rc.mu.Lock()
	defer rc.mu.Unlock()
	e.fetching = false
	if err != nil {
		s.log.Warn("remaining stock unavailable; using sold-out flags", "sale", saleID, "err", err)
		e.at = now // retry after a second, not on every request
		return stale
	}
	e.rem, e.at = rem, now
	return rem
}

// listCache keeps the sale list for a second. While the store cannot
// answer (the database is down), the last list is served, and the store is
// asked again a second later, not on every request.
type listCache struct {
	mu    sync.Mutex
	at    time.Time
	sales []flashsale.Sale
	ok    bool
}

func (lc *listCache) get(now time.Time, load func() ([]flashsale.Sale, error)) ([]flashsale.Sale, error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.ok && now.Sub(lc.at) < time.Second && !now.Before(lc.at) {
		return lc.sales, nil
	}
	sales, err := load()
	if err != nil {
		if lc.ok {
			lc.at = now
			return lc.sales, nil
		}
		return nil, err
	}
	lc.sales, lc.at, lc.ok = sales, now, true
	return sales, nil
}
