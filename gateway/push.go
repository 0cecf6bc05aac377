package gateway

import (
	"context"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

// Push keeps the shoppers' Web Push subscriptions (the push package,
// through the wiring). nil: notifications are off and the push routes
// answer 404 NOT_FOUND.
type Push interface {
	// PublicKey is the VAPID public key the page subscribes with.
	PublicKey() string
	// Subscribe checks body, a browser's subscription (INVALID,
	// TOO_LARGE), and keeps it as the user's for the sale.
	Subscribe(ctx context.Context, sale *flashsale.Sale, userID int64, body []byte) error
	// Unsubscribe forgets the user's subscription for the sale.
	Unsubscribe(ctx context.Context, saleID, userID int64) error
}

var (
	errPushOff   = flashsale.Errorf(flashsale.CodeNotFound, "turn notifications are off")
	errSaleEnded = flashsale.Errorf(flashsale.CodeInvalid, "the sale has ended")
)

// pushKey is GET /api/flash-sales/push: the VAPID public key.
func (s *Server) pushKey(c *fiber.Ctx) error {
	if _, ok := s.checkAddr(c, ClassRead, s.reqNow(c)); !ok {
		return nil
	}
	if s.d.Push == nil {
		return errPushOff
	}
	c.Set(fiber.HeaderCacheControl, "public, max-age=300")
	return c.JSON(struct {
		PublicKey string `json:"publicKey"`
	}{s.d.Push.PublicKey()})
}

// pushSubscribe is PUT /api/flash-sales/sales/{saleId}/push: the caller's
// subscription for a notification at their turn. It reserves nothing and
// changes nothing of the caller's place.
func (s *Server) pushSubscribe(c *fiber.Ctx) error {
	p, sale, ok, err := s.pushRoute(c)
	if !ok {
		return err
	}
	if sale.Ended(s.now()) {
		return errSaleEnded
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	if err := s.d.Push.Subscribe(ctx, sale, p.UserID, c.Body()); err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.SendStatus(fiber.StatusNoContent)
}

// pushUnsubscribe is DELETE /api/flash-sales/sales/{saleId}/push.
func (s *Server) pushUnsubscribe(c *fiber.Ctx) error {
	p, sale, ok, err := s.pushRoute(c)
	if !ok {
		return err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	if err := s.d.Push.Unsubscribe(ctx, sale.ID, p.UserID); err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.SendStatus(fiber.StatusNoContent)
}

// pushRoute is what both subscription routes check first, in this
// order: the caller, the sale id of the path, notifications on, the sale
// known. ok false: answered already (err nil) or err to answer.
func (s *Server) pushRoute(c *fiber.Ctx) (flashsale.Principal, *flashsale.Sale, bool, error) {
	p, ok := s.userRoute(c)
	if !ok {
		return p, nil, false, nil
	}
	saleID, ok := parseID(c.Params("saleId"))
	if !ok {
		return p, nil, false, errBadSaleID
	}
	if s.d.Push == nil {
		return p, nil, false, errPushOff
	}
	sale, ok := s.d.Sales.Sale(saleID)
	if !ok {
		return p, nil, false, errNoSale
	}
	return p, sale, true, nil
}
