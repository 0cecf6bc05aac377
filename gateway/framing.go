package gateway

import (
	"bytes"
	"net"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/conn/watchdog"
)

// Why a request's framing is refused (badFraming), as its 400 message.
const (
	framingBareLF    = "bare LF line end; lines must end with CRLF"
	framingFolded    = "folded header line"
	framingSpaceName = "whitespace in a header name"
	framingCLTE      = "both Content-Length and Transfer-Encoding"
	framingTE        = "Transfer-Encoding other than chunked"
	framingDupCL     = "more than one Content-Length"
	framingDupTE     = "more than one Transfer-Encoding"
)

// badFraming checks the framing of one request head: b is its header
// lines through the blank line that ends them (fasthttp's RawHeaders,
// checked on every request of a connection). It returns why the head is refused,
// or "" for a head whose body length every HTTP/1.1 parser agrees on:
// every line ends with CRLF, no line is folded, no header name ends in
// whitespace, Content-Length appears at most once, Transfer-Encoding at
// most once and only as "chunked", never both. A front proxy and the
// gateway that disagree on where a body ends would let a second request
// hide in the first one's body (request smuggling).
//
// It is one pass over the head bytes without allocation: it runs on the
// purchase path.
func badFraming(b []byte) string {
	var cl, te int
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return "" // truncated head: fasthttp refuses it
		}
		if i == 0 || b[i-1] != '\r' {
			return framingBareLF
		}
		line := b[:i-1]
		b = b[i+1:]
		if len(line) == 0 {
			return "" // the blank line that ends the head
		}
		if line[0] == ' ' || line[0] == '\t' {
			return framingFolded
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			continue // fasthttp refuses a header line without a name
		}
		name := line[:colon]
		if c := name[len(name)-1]; c == ' ' || c == '\t' {
			return framingSpaceName
		}
		switch {
		case len(name) == len("content-length") && name[0]|0x20 == 'c' && asciiEqualFold(name, "content-length"):
			cl++
			if cl > 1 {
				return framingDupCL
			}
		case len(name) == len("transfer-encoding") && name[0]|0x20 == 't' && asciiEqualFold(name, "transfer-encoding"):
			te++
			if te > 1 {
				return framingDupTE
			}
			if !asciiEqualFold(bytes.Trim(line[colon+1:], " \t"), "chunked") {
				return framingTE
			}
		}
		if cl > 0 && te > 0 {
			return framingCLTE
		}
	}
	return ""
}

// badFirstHead is badFraming for a whole head, request line included (the
// splitter's first head of a connection). A truncated head is not
// refused here: fasthttp answers it.
func badFirstHead(b []byte) string {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return ""
	}
	if i == 0 || b[i-1] != '\r' {
		return framingBareLF
	}
	return badFraming(b[i+1:])
}

// asciiEqualFold reports whether b equals the lower-case ASCII string s,
// ignoring the case of b.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// refuseFraming answers a request whose framing badFraming refused: 400
// INVALID, and the connection closes after the answer, so that nothing
// read after this request's head is taken for another request.
func refuseFraming(c *fiber.Ctx, why string) error {
	c.Context().SetConnectionClose()
	r := c.Response()
	r.SetStatusCode(fiber.StatusBadRequest)
	r.Header.SetContentType(fiber.MIMEApplicationJSON)
	r.SetBody(errorBody(nil, flashsale.CodeInvalid, "malformed request framing: "+why, ""))
	return nil
}

// framingRefusal is the whole answer refuseFirstHead writes to a first
// request head badFraming refused, before any server sees the
// connection.
func framingRefusal(why string) []byte {
	body := errorBody(nil, flashsale.CodeInvalid, "malformed request framing: "+why, "")
	b := make([]byte, 0, 160+len(body))
	b = append(b, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"...)
	b = append(b, securityHeaderLines...)
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	return append(b, body...)
}

// refusalLinger bounds how long refuseFirstHead reads (and drops) what a
// refused client still sends after its 400, so that closing the socket
// with unread data does not reset the connection before the client read
// the answer.
const refusalLinger = time.Second

// refuseFirstHead is the splitter's check of a connection's first head
// (split.Deps.Refuse): a head badFirstHead refuses is answered 400 with
// Connection: close before any server sees it, and the connection closed.
// What the client sent after the head (the smuggled request) is read and
// dropped for refusalLinger first: closing a socket with unread data
// resets the connection, and the client could lose the answer.
func refuseFirstHead(conn net.Conn, head []byte) bool {
	why := badFirstHead(head)
	if why == "" {
		return false
	}
	_ = conn.SetWriteDeadline(time.Now().Add(refusalLinger))
	if _, err := conn.Write(framingRefusal(why)); err == nil {
		watchdog.Drain(conn, time.Now().Add(refusalLinger), 64<<10)
	}
	_ = conn.Close()
	return true
}

// Security headers of every answer of the fiber side (pages and API).
// The pages load scripts, styles and workers from their own origin only
// and have no inline script or style (static/README.md); item images may
// come from any https origin.
const (
	headerCSP            = "Content-Security-Policy"
	valueCSP             = "default-src 'self'; img-src 'self' https:; frame-ancestors 'none'"
	headerNoSniff        = "X-Content-Type-Options"
	valueNoSniff         = "nosniff"
	headerReferrerPolicy = "Referrer-Policy"
	valueReferrerPolicy  = "same-origin"
)

const securityHeaderLines = headerCSP + ": " + valueCSP + "\r\n" +
	headerNoSniff + ": " + valueNoSniff + "\r\n" +
	headerReferrerPolicy + ": " + valueReferrerPolicy + "\r\n"

// edgeChecks refuses a request whose framing is unsafe (its head, and its
// request line as the connection's reqLines saw it) and adds the
// security headers to the answer; true means the request was answered.
// Every route and the CORS preflight run it first.
func edgeChecks(c *fiber.Ctx) bool {
	if why := badFraming(c.Request().Header.RawHeaders()); why != "" {
		_ = refuseFraming(c, why)
		return true
	}
	if wc, ok := c.Context().Conn().(*edgeConn); ok {
		switch wc.lines.verdict(c.Context().ConnRequestNum()) {
		case reqLineBareLF:
			_ = refuseFraming(c, framingBareLF)
			return true
		case reqLineClose:
			c.Context().SetConnectionClose()
		}
	}
	h := &c.Response().Header
	h.SetCanonical(bHeaderCSP, bValueCSP)
	h.SetCanonical(bHeaderNoSniff, bValueNoSniff)
	h.SetCanonical(bHeaderReferrerPolicy, bValueReferrerPolicy)
	return false
}

var (
	bHeaderCSP            = []byte(headerCSP)
	bValueCSP             = []byte(valueCSP)
	bHeaderNoSniff        = []byte(headerNoSniff)
	bValueNoSniff         = []byte(valueNoSniff)
	bHeaderReferrerPolicy = []byte(headerReferrerPolicy)
	bValueReferrerPolicy  = []byte(valueReferrerPolicy)
)
