package gateway

import (
	"fmt"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

// Route names (the `route` label of the request metrics).
func (s *Server) routes() {
	app := s.app
	if len(s.cfg.CORSOrigins) > 0 {
		app.Use(s.cors())
	}

	const fs = "/api/flash-sales"
	app.Post(fs+"/items/:itemId/purchase", s.handle("purchase", s.purchase))
	app.Get(fs+"/sales", s.handle("sales_list", s.publicSales))
	app.Get(fs+"/sales/:saleId", s.handle("sale", s.publicSale))
	app.Get(fs+"/sales/:saleId/order", s.handle("sale_order", s.saleOrder))
	app.Get(fs+"/sales/:saleId/draw", s.handle("sale_draw", s.saleDraw))
	app.Post(fs+"/sales/:saleId/queue", s.handle("queue_join", s.queueJoin))
	app.Get(fs+"/sales/:saleId/queue", s.handle("queue_status", s.queueStatus))
	app.Get(fs+"/push", s.handle("push_key", s.pushKey))
	app.Put(fs+"/sales/:saleId/push", s.handle("push_subscribe", s.pushSubscribe))
	app.Delete(fs+"/sales/:saleId/push", s.handle("push_unsubscribe", s.pushUnsubscribe))
	app.Get(fs+"/orders/:orderId", s.handle("order", s.orderGet))
	app.Post(fs+"/orders/:orderId/pay", s.handle("order_pay", s.orderPay))
	app.Post(fs+"/orders/:orderId/cancel", s.handle("order_cancel", s.orderCancel))
	app.Post("/api/shop/orders/:orderId/paid", s.handle("shop_paid", s.shopPaid))

	const ad = "/api/admin"
	app.Post(ad+"/sales", s.handle("admin_sale_create", s.adminCreate))
	app.Get(ad+"/sales", s.handle("admin_sale_list", s.adminList))
	app.Get(ad+"/sales/:saleId", s.handle("admin_sale", s.adminGet))
	app.Get(ad+"/sales/:saleId/report", s.handle("admin_sale_report", s.adminReport))
	app.Get(ad+"/sales/:saleId/shadow", s.handle("admin_shadow", s.adminShadow))
	app.Post(ad+"/sales/:saleId/shadow/:userId/release", s.handle("admin_shadow_release", s.adminShadowRelease))
	app.Patch(ad+"/sales/:saleId", s.handle("admin_sale_update", s.adminUpdate))
	app.Post(ad+"/sales/:saleId/pause", s.handle("admin_sale_pause", s.adminAction(flashsale.ActionPause)))
	app.Post(ad+"/sales/:saleId/resume", s.handle("admin_sale_resume", s.adminAction(flashsale.ActionResume)))
	app.Post(ad+"/sales/:saleId/end", s.handle("admin_sale_end", s.adminAction(flashsale.ActionEnd)))
	app.Post(ad+"/sales/:saleId/message", s.handle("admin_sale_message", s.adminAction(flashsale.ActionMessage)))
	app.Post(ad+"/sales/:saleId/items/:itemId/stock", s.handle("admin_item_stock", s.adminAction(flashsale.ActionStock)))
	app.Post(ad+"/sales/:saleId/codes", s.handle("admin_codes_create", s.adminCodesPost))
	app.Get(ad+"/sales/:saleId/codes", s.handle("admin_codes", s.adminCodesGet(false)))
	app.Get(ad+"/sales/:saleId/codes.csv", s.handle("admin_codes", s.adminCodesGet(true)))
	app.Put(ad+"/sales/:saleId/allowlist", s.handle("admin_allowlist_put", s.adminAllowlistPut(false)))
	app.Post(ad+"/sales/:saleId/allowlist", s.handle("admin_allowlist_append", s.adminAllowlistPut(true)))
	app.Get(ad+"/sales/:saleId/allowlist", s.handle("admin_allowlist", s.adminAllowlistGet))
	app.Get(ad+"/settings", s.handle("admin_settings", s.adminSettingsGet))
	app.Put(ad+"/settings", s.handle("admin_settings_put", s.adminSettingsPut))
	app.Post(ad+"/settings/preset/:name", s.handle("admin_preset", s.adminPreset))
	app.Get(ad+"/audit", s.handle("admin_audit", s.adminAudit))
	app.Get(ad+"/defense", s.handle("admin_defense", s.adminDefense))

	app.Get("/", s.handle("page", s.page("/")))
	app.Get("/sales/:saleId", s.handle("page", s.salePage))
	app.Get("/operator", s.handle("page", s.page("/operator")))
	app.Get("/assets/*", s.handle("asset", s.asset))

	// Everything else, including a known path with another method.
	app.Use(s.handle("unmatched", func(*fiber.Ctx) error { return errNotFound }))
}

// handle wraps a route's handler: errors become the contract's error body,
// panics become 500 INTERNAL, and the answer is counted.
func (s *Server) handle(name string, h fiber.Handler) fiber.Handler {
	m := s.metrics.route(name)
	return func(c *fiber.Ctx) error {
		start := c.Context().Time() // the request's arrival, read by fasthttp
		defer func() {
			if p := recover(); p != nil {
				c.Response().Header.Del(fiber.HeaderContentEncoding)
				_ = s.fail(c, fmt.Errorf("gateway: panic in %s: %v", name, p), 0)
			}
			m.observe(c.Response().StatusCode(), time.Since(start))
		}()
		if edgeChecks(c) {
			return nil
		}
		if err := h(c); err != nil {
			return s.fail(c, err, 0)
		}
		return nil
	}
}

// cors answers preflight requests from the configured origins and marks
// their responses readable.
func (s *Server) cors() fiber.Handler {
	anyOrigin := false
	allowed := make(map[string]bool, len(s.cfg.CORSOrigins))
	for _, o := range s.cfg.CORSOrigins {
		o = strings.TrimRight(strings.TrimSpace(o), "/")
		if o == "*" {
			anyOrigin = true
		}
		allowed[strings.ToLower(o)] = true
	}
	return func(c *fiber.Ctx) error {
		// The framing check comes first: a preflight answered here must
		// not keep a smuggling connection open either.
		if edgeChecks(c) {
			return nil
		}
		h := &c.Response().Header
		if !anyOrigin {
			// Whether the answer allows the origin depends on Origin, so
			// every answer says so, or a shared cache could hand one
			// origin's answer to another.
			h.Add(fiber.HeaderVary, fiber.HeaderOrigin)
		}
		origin := c.Get(fiber.HeaderOrigin)
		if origin == "" || !(anyOrigin || allowed[strings.ToLower(origin)]) {
			return c.Next()
		}
		if anyOrigin {
			h.Set(fiber.HeaderAccessControlAllowOrigin, "*")
		} else {
			h.Set(fiber.HeaderAccessControlAllowOrigin, origin)
		}
		if c.Method() == fiber.MethodOptions && c.Get(fiber.HeaderAccessControlRequestMethod) != "" {
			h.Set(fiber.HeaderAccessControlAllowMethods, "GET, POST, PUT, PATCH, DELETE, OPTIONS")
			h.Set(fiber.HeaderAccessControlAllowHeaders, "Authorization, X-Admission-Token, Content-Type, If-Match")
			h.Set(fiber.HeaderAccessControlMaxAge, "600")
			return c.SendStatus(fiber.StatusNoContent)
		}
		h.Set(fiber.HeaderAccessControlExposeHeaders, "Retry-After, ETag")
		return c.Next()
	}
}
