package gateway

import (
	"context"
	"net"

	"github.com/gofiber/fiber/v2"
)

// ServeBaseline serves the bare fiber handler that HTTP benchmarks measure
// the gateway against: POST /api/flash-sales/items/{itemId}/purchase answers
// 410 with the sold-out body, with no checks at all (no guard, no token, no
// sale lookup). It uses fiber's default configuration on a plain listener,
// as in the baseline of DESIGN.md. It returns when ctx ends (nil) or the
// listener fails.
func ServeBaseline(ctx context.Context, ln net.Listener) error {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Post("/api/flash-sales/items/:itemId/purchase", func(c *fiber.Ctx) error {
		c.Status(fiber.StatusGone)
		c.Response().Header.SetContentType(fiber.MIMEApplicationJSON)
		return c.Send(soldOutBody)
	})
	errc := make(chan error, 1)
	go func() { errc <- app.Listener(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		_ = app.Shutdown()
		<-errc
		return nil
	}
}
