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
// callback: "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<order id>.<raw
// body>">", the order id as in the path.
const SignatureHeader = "X-Flashsale-Signature"

// ShopPayments records the payments the shop's payment provider reports
// (POST /api/shop/orders/{orderId}/paid). Nil in Deps turns the route off
// (403 FORBIDDEN): no payment secret is configured.
type ShopPayments interface {
	// VerifyPayment checks header (SignatureHeader's value) against the
	// path's order id (as sent) and the raw body at now: BAD_SIGNATURE
	// (missing, malformed or wrong) or STALE_SIGNATURE (signed too long
	// before or after now). It returns the signature in a canonical form
	// (what a replay would repeat) and the time it was signed. It must
	// not block.
	VerifyPayment(header, orderID string, body []byte, now time.Time) (sig string, signedAt time.Time, err error)
	// ShopPaid records the signature and the payment of p.OrderID: nil
	// once the order is PAID by this payment (now or before), else the
	// domain error of the refusal (recorded ones answer the same on a
	// repeat; a signature already recorded is REPLAYED).
	ShopPaid(ctx context.Context, p flashsale.ShopPayment) error
	// SpendSignature records a verified signature whose request is
	// refused before ShopPaid (a malformed body or order id), so it is
	// never accepted again: REPLAYED when already recorded.
	SpendSignature(ctx context.Context, sig string, signedAt time.Time) error
}

var errOrderMismatch = flashsale.Invalid("orderId", "must be the order of the path")

var errPaymentsOff = flashsale.Errorf(flashsale.CodeForbidden, "payment callbacks are off: no payment secret is configured")

// paymentBody is the body of a payment callback.
type paymentBody struct {
	PaymentID   string
	AmountCents int64
	Currency    string
	OrderID     string // "" when the provider sent none
}

// maxPaymentID is the longest paymentId accepted, in characters.
const maxPaymentID = 200

// parsePaymentBody parses and checks a payment callback's body:
// {"paymentId": "<1-200 printable characters>", "amountCents": <integer ≥ 0>,
// "currency": "<3 capital letters>", "orderId": "<uuid>" (optional; the
// signature covers the path's order id already)}. Errors are INVALID and
// name the field.
func parsePaymentBody(body []byte) (paymentBody, error) {
	var req struct {
		PaymentID   *string `json:"paymentId"`
		AmountCents *int64  `json:"amountCents"`
		Currency    *string `json:"currency"`
		OrderID     *string `json:"orderId"`
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
	if req.Currency == nil {
		return paymentBody{}, flashsale.Invalid("currency", "required")
	}
	if !flashsale.ValidCurrency(*req.Currency) {
		return paymentBody{}, flashsale.Invalid("currency", "must be a 3-letter ISO 4217 code like EUR")
	}
	out.Currency = *req.Currency
	if req.OrderID != nil {
		id, ok := parseUUID(*req.OrderID)
		if !ok {
			return paymentBody{}, flashsale.Invalid("orderId", "must be a UUID")
		}
		out.OrderID = id
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
	rawID := c.Params("orderId")
	sig, signedAt, err := s.d.Payments.VerifyPayment(c.Get(SignatureHeader), rawID, body, s.reqNow(c))
	if err != nil {
		return err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	id, req, err := parsePaidRequest(rawID, body)
	if err != nil {
		// Authentic but refused: the signature is spent all the same,
		// so it is accepted nowhere later.
		if serr := s.d.Payments.SpendSignature(ctx, sig, signedAt); serr != nil {
			return serr
		}
		return err
	}
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

// parsePaidRequest checks a payment callback's order id and body.
func parsePaidRequest(rawID string, body []byte) (string, paymentBody, error) {
	id, ok := parseUUID(rawID)
	if !ok {
		return "", paymentBody{}, errBadOrderID
	}
	req, err := parsePaymentBody(body)
	if err != nil {
		return "", paymentBody{}, err
	}
	if req.OrderID != "" && req.OrderID != id {
		return "", paymentBody{}, errOrderMismatch
	}
	return id, req, nil
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
