package gateway

import (
	"context"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

// SignatureHeader carries the shop's provider's signature of a payment
// callback: "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">".
const SignatureHeader = "X-Flashsale-Signature"

// ShopPayments records the payments the shop's payment provider reports
// (POST /api/shop/orders/{orderId}/paid). Nil in Deps turns the route off
// (403 FORBIDDEN): no payment secret is configured.
type ShopPayments interface {
	// VerifyPayment checks header (SignatureHeader's value) against the
	// raw body at now: BAD_SIGNATURE (missing, malformed or wrong) or
	// STALE_SIGNATURE (signed too long before or after now). It returns
	// the signature in a canonical form (what a replay would repeat) and
	// the time it was signed. It must not block.
	VerifyPayment(header string, body []byte, now time.Time) (sig string, signedAt time.Time, err error)
	// ShopPaid records the payment of p.OrderID: nil once the order is
	// PAID by this payment (now or before), else the domain error of the
	// refusal (recorded ones answer the same on a repeat).
	ShopPaid(ctx context.Context, p flashsale.ShopPayment) error
}

var errPaymentsOff = flashsale.Errorf(flashsale.CodeForbidden, "payment callbacks are off: no payment secret is configured")

// paymentBody is the body of a payment callback.
type paymentBody struct {
	PaymentID   string
	AmountCents int64
	Currency    string
}

// maxPaymentID is the longest paymentId accepted, in characters.
const maxPaymentID = 200

// parsePaymentBody parses and checks a payment callback's body:
// {"paymentId": "<1-200 printable characters>", "amountCents": <integer ≥ 0>,
// "currency": "<3 capital letters>" (optional)}. Errors are INVALID and
// name the field.
func parsePaymentBody(body []byte) (paymentBody, error) {
	var req struct {
		PaymentID   *string `json:"paymentId"`
		AmountCents *int64  `json:"amountCents"`
		Currency    *string `json:"currency"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return paymentBody{}, err
	}
	var out paymentBody
	switch {
	case req.PaymentID == nil || *req.PaymentID == "":
		return paymentBody{}, flashsale.Invalid("paymentId", "required")
	case !utf8.ValidString(*req.PaymentID) || utf8.RuneCountInString(*req.PaymentID) > maxPaymentID:
		return paymentBody{}, flashsale.Invalid("paymentId", "must be 1 to %d printable characters", maxPaymentID)
	case strings.ContainsFunc(*req.PaymentID, func(r rune) bool { return !unicode.IsPrint(r) }):
		return paymentBody{}, flashsale.Invalid("paymentId", "must be 1 to %d printable characters", maxPaymentID)
	}
	out.PaymentID = *req.PaymentID
	if req.AmountCents == nil {
		return paymentBody{}, flashsale.Invalid("amountCents", "required")
	}
	if *req.AmountCents < 0 {
		return paymentBody{}, flashsale.Invalid("amountCents", "must be a whole number of cents, 0 or more")
	}
	out.AmountCents = *req.AmountCents
	if req.Currency != nil {
		c := *req.Currency
		if len(c) != 3 || strings.ContainsFunc(c, func(r rune) bool { return r < 'A' || r > 'Z' }) {
			return paymentBody{}, flashsale.Invalid("currency", "must be a 3-letter ISO 4217 code like EUR")
		}
		out.Currency = c
	}
	return out, nil
}

// paidJSON is the answer of an accepted payment callback.
type paidJSON struct {
	OrderID   string `json:"orderId"`
	Status    string `json:"status"`
	PaymentID string `json:"paymentId"`
}

// shopPaid is POST /api/shop/orders/{orderId}/paid, called by the shop's
// payment provider, server to server. The signature is its
// authentication, so it runs no access-token check and no per-address
// limit (a provider calls from few addresses); a refused signature costs
// one HMAC and touches no dependency.
func (s *Server) shopPaid(c *fiber.Ctx) error {
	if s.d.Payments == nil {
		return errPaymentsOff
	}
	body := c.Body()
	sig, signedAt, err := s.d.Payments.VerifyPayment(c.Get(SignatureHeader), body, s.reqNow(c))
	if err != nil {
		return err
	}
	id, ok := parseUUID(c.Params("orderId"))
	if !ok {
		return errBadOrderID
	}
	req, err := parsePaymentBody(body)
	if err != nil {
		return err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	err = s.d.Payments.ShopPaid(ctx, flashsale.ShopPayment{
		OrderID: id, PaymentID: req.PaymentID, AmountCents: req.AmountCents, Currency: req.Currency,
		Signature: sig, SignedAt: signedAt,
	})
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(paidJSON{OrderID: id, Status: string(flashsale.OrderPaid), PaymentID: req.PaymentID})
}

// errPayOnShop refuses the simulated pay when the shop takes payment on
// its own page (Config.PaymentURL).
var errPayOnShop = flashsale.Errorf(flashsale.CodeForbidden, "pay on the shop's payment page")

// paymentURL is Config.PaymentURL filled with the order id, or "" when
// none is configured.
func (s *Server) paymentURL(orderID string) string {
	if s.cfg.PaymentURL == "" {
		return ""
	}
	return strings.ReplaceAll(s.cfg.PaymentURL, "{orderId}", url.PathEscape(orderID))
}
