package gateway

import (
	"bytes"
	"context"
	"net/http"
	"net/netip"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

// HeaderAdmissionToken carries the waiting room's admission token.
const HeaderAdmissionToken = "X-Admission-Token"

// clientAddr is the caller's address as the Guard resolves it from the peer
// and X-Forwarded-For.
func (s *Server) clientAddr(c *fiber.Ctx) netip.Addr {
	return s.d.Guard.ClientAddr(connPeer(c), forwardedFor(c))
}

// connPeer is the address of the request's peer: the edge connection's,
// read when it was accepted, or (a connection served otherwise, as in
// tests) fasthttp's.
func connPeer(c *fiber.Ctx) netip.Addr {
	if ec, ok := c.Context().Conn().(*edgeConn); ok {
		return ec.peer
	}
	return peerAddr(c.Context().RemoteAddr())
}

// forwardedFor is every X-Forwarded-For header of the request joined with
// ",", without allocating for zero or one header.
func forwardedFor(c *fiber.Ctx) string {
	all := c.Request().Header.PeekAll(fiber.HeaderXForwardedFor)
	switch len(all) {
	case 0:
		return ""
	case 1:
		return c.Get(fiber.HeaderXForwardedFor)
	default:
		return string(bytes.Join(all, []byte(",")))
	}
}

// checkAddr applies the Guard's address checks of class and writes the
// refusal; false when refused.
func (s *Server) checkAddr(c *fiber.Ctx, class string, now time.Time) (netip.Addr, bool) {
	ip := s.clientAddr(c)
	if retry, err := s.d.Guard.CheckAddrAt(ip, class, now); err != nil {
		_ = s.fail(c, err, retry)
		return ip, false
	}
	return ip, true
}

// principal verifies the access token of the request.
func (s *Server) principal(c *fiber.Ctx, now time.Time) (flashsale.Principal, error) {
	p, err := s.d.Access.VerifyAt(bearerToken(c.Get(fiber.HeaderAuthorization)), now)
	if err != nil {
		if flashsale.ErrorCode(err) == flashsale.CodeUnavailable {
			return p, err
		}
		return p, errUnauthenticated
	}
	if p.UserID <= 0 {
		return p, errUnauthenticated
	}
	return p, nil
}

// guarded runs the address check, the access token and the user check of
// a shopper route, in that order (cheapest first).
func (s *Server) guarded(c *fiber.Ctx, class string) (flashsale.Principal, netip.Addr, bool) {
	return s.guardedJoin(c, class, 0)
}

// guardedJoin is guarded for a join of sale saleID (0: not a join): a
// refusal of the guard is counted for the sale's report (joinRefused).
func (s *Server) guardedJoin(c *fiber.Ctx, class string, saleID int64) (flashsale.Principal, netip.Addr, bool) {
	now := s.reqNow(c)
	ip := s.clientAddr(c)
	if retry, err := s.d.Guard.CheckAddrAt(ip, class, now); err != nil {
		s.joinRefused(saleID, err, false)
		_ = s.fail(c, err, retry)
		return flashsale.Principal{}, ip, false
	}
	p, err := s.principal(c, now)
	if err != nil {
		_ = s.fail(c, err, 0)
		return p, ip, false
	}
	if retry, err := s.d.Guard.CheckUserAt(p.UserID, class, now); err != nil {
		s.joinRefused(saleID, err, true)
		_ = s.fail(c, err, retry)
		return p, ip, false
	}
	return p, ip, true
}

// Rules of a join refused by the guard at the edge, as the sale's report
// names them (the room names the refusals it makes itself).
const (
	refusedBlocklist  = "blocklist"
	refusedPerAddress = "perAddress" // the per-address or per-prefix limit: the guard's answer does not say which
	refusedPerUser    = "perUser"
)

// joinRefused tells the room of a join of saleID that the guard refused,
// by rule: BLOCKED is the blocklist's, RATE_LIMITED the address's limits
// or, from the user check (user), the user's. Only a sale of the cache
// counts, so refusals naming made-up sales add nothing to any report.
func (s *Server) joinRefused(saleID int64, err error, user bool) {
	if saleID <= 0 {
		return
	}
	if _, ok := s.d.Sales.Sale(saleID); !ok {
		return
	}
	switch flashsale.ErrorCode(err) {
	case flashsale.CodeBlocked:
		s.d.Queue.Refused(saleID, refusedBlocklist)
	case flashsale.CodeRateLimited:
		if user {
			s.d.Queue.Refused(saleID, refusedPerUser)
		} else {
			s.d.Queue.Refused(saleID, refusedPerAddress)
		}
	}
}

// purchase is POST /api/flash-sales/items/{itemId}/purchase. Checks run
// cheapest first, so that a request that will be refused never reaches
// Redis:
//
//	body and head limits (fasthttp) → Guard.CheckAddrAt (address blocklist,
//	per-IP and per-prefix limits) → item id and the in-memory item lookup
//	(400, 404) → access token (401; a verified-token cache makes a
//	shopper's repeated clicks cost one map lookup) → Guard.CheckUserAt (user
//	blocklist, per-user limit) → local sold-out flag (410; not in queue
//	order) → sale open (403), not paused (409) and admission token (403)
//	→ Reserve (Claim in queue order).
func (s *Server) purchase(c *fiber.Ctx) error {
	s.countSaleRequest()
	now := s.reqNow(c)
	if _, ok := s.checkAddr(c, ClassPurchase, now); !ok {
		return nil
	}
	itemID, ok := parseID(c.Params("itemId"))
	if !ok {
		return errBadItemID
	}
	sale, item, ok := s.d.Sales.ItemSale(itemID)
	if !ok {
		return errNoItem
	}
	p, err := s.principal(c, now)
	if err != nil {
		return err
	}
	if retry, err := s.d.Guard.CheckUserAt(p.UserID, ClassPurchase, now); err != nil {
		return s.fail(c, err, retry)
	}
	// In queue order the units may all be held: a holder buys past the
	// sold-out flag, anyone else is refused by the admission check.
	queue := sale.QueueOrder()
	if !queue && s.d.Purchase.SoldOut(itemID) {
		return rawJSON(c, http.StatusGone, soldOutBody)
	}
	if !sale.Open(now) {
		return errSaleNotOpen
	}
	if sale.Paused {
		return errSalePaused
	}
	if _, err := s.d.Admission.Verify(c.Get(HeaderAdmissionToken), p.UserID, sale.ID, now); err != nil {
		return rawJSON(c, http.StatusForbidden, notAdmittedBody)
	}
	// Reserve bounds its Redis call and its publish itself and, once the
	// unit is taken, runs to those bounds whatever its caller does: a
	// deadline of the request's own would only cost a timer.
	reserve := s.d.Purchase.Reserve
	if queue {
		reserve = s.d.Purchase.Claim
	}
	orderID, err := reserve(context.Background(), sale, item, p.UserID)
	if err != nil {
		return err
	}
	r := c.Response()
	r.SetStatusCode(http.StatusAccepted)
	r.Header.SetContentType(fiber.MIMEApplicationJSON)
	var buf [96]byte
	b := append(buf[:0], `{"orderId":`...)
	b = appendJSONString(b, orderID)
	b = append(b, `,"status":"PENDING"}`...)
	r.SetBody(b)
	return nil
}

// countSaleRequest counts a purchase or order request (Config.SaleRequests).
func (s *Server) countSaleRequest() {
	if n := s.cfg.SaleRequests; n != nil {
		n.Add(1)
	}
}

// rawJSON answers status with a precomputed JSON body (the hot refusals),
// without copying it.
func rawJSON(c *fiber.Ctx, status int, body []byte) error {
	r := c.Response()
	r.SetStatusCode(status)
	r.Header.SetContentType(fiber.MIMEApplicationJSON)
	r.SetBodyRaw(body)
	return nil
}
