package orders

import (
	"context"
	"errors"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/events"
)

// PaymentSignatureWindow is how far a payment callback's signing time may
// be from the gateway's clock, either way (CONTRACT section 5).
const PaymentSignatureWindow = 5 * time.Minute

// Payments is the shop's payment callback: the signature check under the
// payment secret (FLASHSALE_PAYMENT_SECRET), and the order service's
// record of the payment, whose replay rules (a signature is accepted once,
// fleet-wide) ShopPaid and SpendSignature keep.
//
// A signature binds everything the callback authorises: it is the HMAC of
// its time, the path's order id and the whole body (payment id, amount,
// currency), so a signed payment is neither replayed onto another order
// nor altered.
type Payments struct {
	secret []byte
	orders *Service
}

// NewPayments returns the payment callback of the orders of s, verified
// under secret.
func NewPayments(secret []byte, s *Service) *Payments {
	return &Payments{secret: secret, orders: s}
}

var (
	errBadSignature   = flashsale.Errorf(flashsale.CodeBadSignature, "missing, malformed or wrong X-Flashsale-Signature")
	errStaleSignature = flashsale.Errorf(flashsale.CodeStaleSignature, "the signature's timestamp is more than 5 minutes from the server's clock; sign the request anew")
)

// VerifyPayment checks the signature with events.VerifyFor, bound to the
// path's order id, and returns its canonical form and signing time. The
// canonical signature is the one this secret makes of (t, order id,
// body): any header that passes for the same request, however spaced or
// with however many v1 parts, names the same replay.
func (p *Payments) VerifyPayment(header, orderID string, body []byte, now time.Time) (string, time.Time, error) {
	at, err := events.VerifyFor(p.secret, header, orderID, body, now, PaymentSignatureWindow)
	switch {
	case errors.Is(err, events.ErrSignatureStale):
		return "", time.Time{}, errStaleSignature
	case err != nil:
		return "", time.Time{}, errBadSignature
	}
	return events.SignFor(p.secret, at, orderID, body), at, nil
}

// ShopPaid records a verified payment (Service.ShopPaid).
func (p *Payments) ShopPaid(ctx context.Context, sp flashsale.ShopPayment) error {
	return p.orders.ShopPaid(ctx, sp)
}

// SpendSignature records a verified signature refused before ShopPaid
// (Service.SpendSignature).
func (p *Payments) SpendSignature(ctx context.Context, sig string, signedAt time.Time) error {
	return p.orders.SpendSignature(ctx, sig, signedAt)
}
