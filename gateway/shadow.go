package gateway

import (
	"strconv"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

// defaultShadowList and maxShadowList bound the shoppers GET
// /api/admin/sales/{saleId}/shadow lists (?limit=).
const (
	defaultShadowList = 100
	maxShadowList     = 1000
)

// adminShadow is GET /api/admin/sales/{saleId}/shadow: the sale's shadow
// queue, how many are in it and why, and the earliest of them.
func (s *Server) adminShadow(c *fiber.Ctx) error {
	if _, ok := s.operator(c); !ok {
		return nil
	}
	id, ok := parseID(c.Params("saleId"))
	if !ok {
		return errBadSaleID
	}
	limit := defaultShadowList
	if v := c.Query("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxShadowList {
			return flashsale.Invalid("limit", "must be an integer from 0 to %d", maxShadowList)
		}
		limit = n
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	if _, err := s.d.SaleAdmin.Get(ctx, id); err != nil {
		return err
	}
	q, err := s.d.Queue.ShadowList(ctx, id, limit)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(q)
}

// adminShadowRelease is POST
// /api/admin/sales/{saleId}/shadow/{userId}/release: the shopper leaves
// the shadow queue; their page joins again as anyone's within seconds.
func (s *Server) adminShadowRelease(c *fiber.Ctx) error {
	p, ok := s.operator(c)
	if !ok {
		return nil
	}
	id, ok := parseID(c.Params("saleId"))
	if !ok {
		return errBadSaleID
	}
	user, ok := parseID(c.Params("userId"))
	if !ok {
		return flashsale.Invalid("userId", "must be a positive integer")
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	if _, err := s.d.SaleAdmin.Get(ctx, id); err != nil {
		return err
	}
	if err := s.d.Queue.ReleaseShadowed(ctx, id, user); err != nil {
		return err
	}
	s.log.Info("shadowed shopper released", "sale", id, "user", user, "operator", actor(p))
	return c.JSON(fiber.Map{"saleId": id, "userId": user, "released": true})
}
