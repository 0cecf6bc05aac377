package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

// statusOf is the one mapping from domain error codes to HTTP statuses.
// Unknown codes are 500.
func statusOf(code flashsale.Code) int {
	switch code {
	case flashsale.CodeSalePaused:
		return http.StatusConflict
	case flashsale.CodeVersionConflict:
		return http.StatusPreconditionFailed
	case flashsale.CodeInvalid:
		return http.StatusBadRequest
	case flashsale.CodeUnauthenticated, flashsale.CodeBadSignature, flashsale.CodeStaleSignature:
		return http.StatusUnauthorized
	case flashsale.CodeForbidden, flashsale.CodeNotAdmitted, flashsale.CodeBlocked,
		flashsale.CodeNotInvited, flashsale.CodeCodeInvalid, flashsale.CodeCodeUsed, flashsale.CodeNotYet:
		return http.StatusForbidden
	case flashsale.CodeNotFound:
		return http.StatusNotFound
	case flashsale.CodeAlreadyPurchased, flashsale.CodeOrderExpired, flashsale.CodeOrderCancelled,
		flashsale.CodeNotPayableYet, flashsale.CodeOrderPaid, flashsale.CodeReplayed, flashsale.CodePaymentMismatch:
		return http.StatusConflict
	case flashsale.CodeNotDrawn, flashsale.CodeChoiceClosed, flashsale.CodeDuplicateIdentity:
		return http.StatusConflict
	case flashsale.CodeSoldOut:
		return http.StatusGone
	case flashsale.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case flashsale.CodeRateLimited:
		return http.StatusTooManyRequests
	case flashsale.CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// errorBody is the contract's error body, built without reflection:
// {"error":"CODE","message":"...","orderId":"..."} (orderId only when set).
func errorBody(dst []byte, code flashsale.Code, msg, orderID string) []byte {
	dst = append(dst, `{"error":`...)
	dst = appendJSONString(dst, string(code))
	dst = append(dst, `,"message":`...)
	dst = appendJSONString(dst, msg)
	if orderID != "" {
		dst = append(dst, `,"orderId":`...)
		dst = appendJSONString(dst, orderID)
	}
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// retryAfterSeconds is the Retry-After value for d: whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	sec := int64((d + time.Second - 1) / time.Second)
	return max(sec, 1)
}

// resolve turns err into what the caller sees: status, code, message and
// order id. Internal errors are logged here, once. A dependency call that
// ran out of its time (Config.RequestTimeout) is UNAVAILABLE: the
// dependency is down or slow, and the caller may retry.
func (s *Server) resolve(err error, route string) (status int, code flashsale.Code, msg, orderID string) {
	code = flashsale.ErrorCode(err)
	if code == flashsale.CodeInternal && errors.Is(err, context.DeadlineExceeded) {
		s.log.Warn("dependency timed out", "route", route, "err", err)
		code = flashsale.CodeUnavailable
	}
	status = statusOf(code)
	if status == http.StatusInternalServerError {
		s.log.Error("request failed", "route", route, "err", err)
		return status, flashsale.CodeInternal, "internal error", ""
	}
	if code == flashsale.CodeUnavailable {
		s.logUnavailable(route, err)
	}
	var de *flashsale.Error
	if errors.As(err, &de) {
		msg, orderID = de.Message, de.OrderID
	}
	if msg == "" {
		msg = defaultMessage(code)
	}
	return status, code, msg, orderID
}

// logUnavailable logs what made a request answer UNAVAILABLE, at most
// once a second (an outage answers thousands): the answer itself only
// says "retry", and without the cause an operator, or a test that met
// one, cannot tell a stopped dependency from a slow one.
func (s *Server) logUnavailable(route string, err error) {
	now := time.Now().Unix()
	last := s.unavailableLogged.Load()
	if now == last || !s.unavailableLogged.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("answered unavailable", "route", route, "err", err)
}

func defaultMessage(code flashsale.Code) string {
	switch code {
	case flashsale.CodeRateLimited:
		return "too many requests; retry later"
	case flashsale.CodeUnavailable:
		return "temporarily unavailable; retry later"
	}
	return string(code)
}

// fail writes err as the contract's error body. retry is the Retry-After of
// RATE_LIMITED and UNAVAILABLE answers (0: 1 second).
func (s *Server) fail(c *fiber.Ctx, err error, retry time.Duration) error {
	status, code, msg, orderID := s.resolve(err, routeName(c))
	r := c.Response()
	r.SetStatusCode(status)
	r.Header.SetContentType(fiber.MIMEApplicationJSON)
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		var buf [20]byte
		r.Header.SetBytesV(fiber.HeaderRetryAfter, strconv.AppendInt(buf[:0], retryAfterSeconds(retry), 10))
	}
	var buf [256]byte
	r.SetBody(errorBody(buf[:0], code, msg, orderID))
	return nil
}

// routeName is the route pattern of c, for logs.
func routeName(c *fiber.Ctx) string { return c.Route().Path }

// fiberError handles errors fiber and fasthttp raise before a handler runs
// (oversized bodies or heads, timeouts, malformed requests).
func (s *Server) fiberError(c *fiber.Ctx, err error) error {
	status := http.StatusInternalServerError
	var fe *fiber.Error
	if errors.As(err, &fe) {
		status = fe.Code
	}
	var de *flashsale.Error
	switch status {
	case http.StatusRequestEntityTooLarge:
		de = flashsale.Errorf(flashsale.CodeTooLarge, "request body too large")
		lingerOnClose(c)
	case http.StatusRequestHeaderFieldsTooLarge:
		de = flashsale.Errorf(flashsale.CodeTooLarge, "request head too large")
		lingerOnClose(c)
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		de = errNotFound
	case http.StatusRequestTimeout, http.StatusBadRequest:
		de = flashsale.Errorf(flashsale.CodeInvalid, "malformed or incomplete request")
	default:
		s.log.Error("request failed", "route", "fiber", "err", err)
		status = http.StatusInternalServerError
		de = flashsale.Errorf(flashsale.CodeInternal, "internal error")
	}
	r := c.Response()
	r.SetStatusCode(status)
	r.Header.SetContentType(fiber.MIMEApplicationJSON)
	r.SetBody(errorBody(nil, de.Code, de.Message, ""))
	s.metrics.unrouted.observe(status, 0)
	return nil
}

// lingerOnClose makes the close that follows a refusal of an unread
// request a lingering one (internal/conn/watchdog), so that the client
// reads the answer.
func lingerOnClose(c *fiber.Ctx) {
	if ec, ok := c.Context().Conn().(*edgeConn); ok {
		ec.LingerOnClose()
	}
}

// Shared errors.
var (
	errNotFound        = flashsale.Errorf(flashsale.CodeNotFound, "not found")
	errUnauthenticated = flashsale.Errorf(flashsale.CodeUnauthenticated, "missing, invalid or expired access token")
	errForbidden       = flashsale.Errorf(flashsale.CodeForbidden, "operator role required")
	errNotAdmitted     = flashsale.Errorf(flashsale.CodeNotAdmitted, "no valid admission token for this sale; join the waiting room")
	errSaleNotOpen     = flashsale.Errorf(flashsale.CodeNotAdmitted, "the sale is not open")
	errBadItemID       = flashsale.Errorf(flashsale.CodeInvalid, "malformed item id")
	errBadSaleID       = flashsale.Errorf(flashsale.CodeInvalid, "malformed sale id")
	errBadOrderID      = flashsale.Errorf(flashsale.CodeInvalid, "malformed order id")
	errNoItem          = flashsale.Errorf(flashsale.CodeNotFound, "no such item")
	errNoSale          = flashsale.Errorf(flashsale.CodeNotFound, "no such sale")
	errSalePaused      = flashsale.Errorf(flashsale.CodeSalePaused, "the sale is paused; keep your place")
)

// notAdmittedBody is the precomputed 403 body of the purchase path's most
// common refusal (no or bad admission token), from the same error value
// the slow path would render.
var notAdmittedBody = errorBody(nil, errNotAdmitted.Code, errNotAdmitted.Message, "")

// soldOutBody is the precomputed 410 body of the hot reject path.
var soldOutBody = errorBody(nil, flashsale.CodeSoldOut, "this item is sold out", "")
