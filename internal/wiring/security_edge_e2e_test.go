package wiring_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale/defense"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// The end-to-end tests of the edge rows of the security findings: the
// per-prefix limit on by default, request smuggling shapes, security
// headers, connections that never send a request, access-token subjects
// and lifetimes, binary WebSocket frames. Each goes through a real
// gateway socket.

// behindProxy trusts the loopback address as a proxy, so that a test
// chooses its client addresses with X-Forwarded-For.
func behindProxy(c *wiring.Config) {
	c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
}

// defaultDefense stores the settings an operator who never stored any has.
func defaultDefense(t *testing.T, s *stack) {
	t.Helper()
	body, err := json.Marshal(defense.DefaultSettings())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.App.SetDefense(context.Background(), "test", body); err != nil {
		t.Fatal(err)
	}
}

// TestSecurityEdgePrefixLimitOnByDefault: 100 addresses of one IPv4 /24,
// or of one IPv6 /64, one request each, are held by the default
// per-prefix limit.
func TestSecurityEdgePrefixLimitOnByDefault(t *testing.T) {
	s := startStack(t, behindProxy)
	saleID, _ := s.createSale(1)
	defaultDefense(t, s)
	path := fmt.Sprintf("/api/flash-sales/sales/%d", saleID)
	for _, tc := range []struct {
		name string
		addr func(i int) string
	}{
		{"ipv4 /24", func(i int) string { return fmt.Sprintf("198.51.100.%d", i+1) }},
		{"ipv6 /64", func(i int) string { return fmt.Sprintf("2001:db8:7:9::%x", i+1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limited := 0
			for i := range 100 {
				r := s.Do("GET", path, "", nil, "X-Forwarded-For", tc.addr(i))
				switch r.Status {
				case http.StatusOK:
				case http.StatusTooManyRequests:
					limited++
				default:
					t.Fatalf("request %d: status %d, body %s", i, r.Status, r.Raw)
				}
			}
			if limited == 0 {
				t.Fatal("100 requests from 100 addresses of one prefix: none limited, want the default per-prefix limit to hold them")
			}
		})
	}
}

// TestSecurityEdgeWSCapPerIPv6Prefix: the waiting room's per-address
// connection cap counts an IPv6 /64 as one address.
func TestSecurityEdgeWSCapPerIPv6Prefix(t *testing.T) {
	s := startStack(t, behindProxy, func(c *wiring.Config) { c.WSMaxConnsPerAddr = 2 })
	saleID, _ := s.createSale(1)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	url := strings.Replace(s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	dial := func(addr string) (*websocket.Conn, *http.Response, error) {
		h := http.Header{}
		h.Set("X-Forwarded-For", addr)
		return websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h})
	}
	for i := range 2 {
		c, _, err := dial(fmt.Sprintf("2001:db8:5:5::%d", i+1))
		if err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
		defer c.CloseNow()
	}
	c, hresp, err := dial("2001:db8:5:5::3")
	if err == nil {
		c.CloseNow()
		t.Fatal("third connection from one /64 accepted with a cap of 2")
	}
	if hresp == nil || hresp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third connection: %v (response %v), want 429", err, hresp)
	}
	// Another /64 is another address.
	c, _, err = dial("2001:db8:5:6::1")
	if err != nil {
		t.Fatalf("connection from another /64: %v", err)
	}
	c.CloseNow()
}

// rawExchange writes req on a fresh connection to the public port and
// returns every response read until the server closes the connection
// (or 5 s pass: then closed is false).
func rawExchange(t *testing.T, s *stack, req string) (resps []*http.Response, closed bool) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.App.PublicURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	all, err := io.ReadAll(conn)
	var ne net.Error
	closed = err == nil || !(errors.As(err, &ne) && ne.Timeout())
	br := bufio.NewReader(bytes.NewReader(all))
	for {
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		resps = append(resps, r)
	}
	return resps, closed
}

// TestSecurityEdgeSmugglingRefused: each request-smuggling shape gets 400
// with Connection: close, as the first request of a connection or a later
// one, and the request hidden after it is never answered.
func TestSecurityEdgeSmugglingRefused(t *testing.T) {
	s := startStack(t)
	const smuggled = "GET /api/flash-sales/sales HTTP/1.1\r\nHost: x\r\n\r\n"
	const purchase = "POST /api/flash-sales/items/1/purchase HTTP/1.1\r\nHost: x\r\n"
	shapes := []struct{ name, req string }{
		{"CL and TE", purchase + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled},
		{"TE xchunked", purchase + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + smuggled},
		{"TE identity with CL", purchase + "Transfer-Encoding: identity\r\nContent-Length: 0\r\n\r\n" + smuggled},
		{"duplicate CL", purchase + "Content-Length: 0\r\nContent-Length: 0\r\n\r\n" + smuggled},
		{"differing CL", purchase + "Content-Length: 0\r\nContent-Length: " + fmt.Sprint(len(smuggled)) + "\r\n\r\n" + smuggled},
		{"bare LF", "POST /api/flash-sales/items/1/purchase HTTP/1.1\nHost: x\nContent-Length: 0\n\n" + smuggled},
		{"bare LF in a header", purchase + "X-A: 1\nContent-Length: 0\r\n\r\n" + smuggled},
		{"bare LF ending the request line", "POST /api/flash-sales/items/1/purchase HTTP/1.1\nHost: x\r\nContent-Length: 0\r\n\r\n" + smuggled},
	}
	const first = "GET /api/flash-sales/sales HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, sh := range shapes {
		for _, keepAlive := range []bool{false, true} {
			name := sh.name
			req := sh.req
			want := 1 // responses: the 400
			if keepAlive {
				name += "/after a good request"
				req = first + req
				want = 2
			}
			t.Run(name, func(t *testing.T) {
				resps, closed := rawExchange(t, s, req)
				if !closed {
					t.Errorf("connection still open after the refusal")
				}
				if len(resps) != want {
					var got []int
					for _, r := range resps {
						got = append(got, r.StatusCode)
					}
					t.Fatalf("got %d responses (statuses %v), want %d: the smuggled request must not be answered", len(resps), got, want)
				}
				if keepAlive && resps[0].StatusCode != http.StatusOK {
					t.Fatalf("first request: status %d, want 200", resps[0].StatusCode)
				}
				r := resps[want-1]
				if r.StatusCode != http.StatusBadRequest || !r.Close {
					t.Fatalf("status %d, Connection: close %v; want 400 and close", r.StatusCode, r.Close)
				}
				var body struct{ Error string }
				b, _ := io.ReadAll(r.Body)
				if err := json.Unmarshal(b, &body); err != nil || body.Error != "INVALID" {
					t.Fatalf("body %s, want error INVALID", b)
				}
			})
		}
	}
}

// TestSecurityEdgeHeaders: pages and API answers carry the security
// headers, and every answer of a CORS-enabled gateway says it varies by
// Origin.
func TestSecurityEdgeHeaders(t *testing.T) {
	s := startStack(t, func(c *wiring.Config) { c.CORSOrigins = []string{"https://shop.example"} })
	saleID, _ := s.createSale(1)
	want := map[string]string{
		"Content-Security-Policy": "default-src 'self'; img-src 'self' https:; frame-ancestors 'none'",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "same-origin",
	}
	for _, path := range []string{"/", fmt.Sprintf("/sales/%d", saleID), "/operator",
		fmt.Sprintf("/api/flash-sales/sales/%d", saleID), "/api/flash-sales/sales/999999"} {
		r := s.Do("GET", path, "", nil)
		for k, v := range want {
			if got := r.Header.Get(k); got != v {
				t.Errorf("GET %s: %s = %q, want %q", path, k, got, v)
			}
		}
		if !hasVary(r.Header, "Origin") {
			t.Errorf("GET %s without Origin: Vary = %q, want Origin in it", path, r.Header.Values("Vary"))
		}
	}
	r := s.Do("GET", "/api/flash-sales/sales", "", nil, "Origin", "https://shop.example")
	if r.Header.Get("Access-Control-Allow-Origin") != "https://shop.example" || !hasVary(r.Header, "Origin") {
		t.Errorf("allowed origin: Allow-Origin %q, Vary %q", r.Header.Get("Access-Control-Allow-Origin"), r.Header.Values("Vary"))
	}
}

func hasVary(h http.Header, name string) bool {
	for _, v := range h.Values("Vary") {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), name) {
				return true
			}
		}
	}
	return false
}

// TestSecurityEdgePendingConnectionCap: an address holding the most
// connections allowed without a first request gets its next connection
// closed at once; the held ones still work.
func TestSecurityEdgePendingConnectionCap(t *testing.T) {
	s := startStack(t, func(c *wiring.Config) { c.MaxPendingConnsPerAddr = 3 })
	addr := strings.TrimPrefix(s.App.PublicURL, "http://")
	before := metricValue(t, s.App.AdminURL, "flashsale_gateway_pending_connections_refused_total")
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	var one [1]byte
	if _, err := extra.Read(one[:]); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("fourth idle connection: read %v, want it closed at once", err)
	}
	if got := metricValue(t, s.App.AdminURL, "flashsale_gateway_pending_connections_refused_total") - before; got != 1 {
		t.Errorf("refused connections counted = %v, want 1", got)
	}
	// A held connection still serves its request.
	c := held[0]
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /api/flash-sales/sales HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("held connection: %v, %v; want 200", r, err)
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// hs256 signs claims with the stacks' secret, as any HS256 issuer would.
func hs256(t *testing.T, claims map[string]any) string {
	t.Helper()
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	body, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	msg := head + "." + enc.EncodeToString(body)
	m := hmac.New(sha256.New, []byte(apptest.Secret))
	m.Write([]byte(msg))
	return msg + "." + enc.EncodeToString(m.Sum(nil))
}

// TestSecurityEdgeTokenSubjectAndLifetime: a subject that is not
// canonical decimal, or a lifetime over the cap, is 401.
func TestSecurityEdgeTokenSubjectAndLifetime(t *testing.T) {
	s := startStack(t)
	saleID, _ := s.createSale(1)
	path := fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID)
	now := time.Now()
	tests := []struct {
		name   string
		claims map[string]any
		status int
	}{
		{"canonical", map[string]any{"sub": "42", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}, http.StatusNotFound},
		{"leading zero", map[string]any{"sub": "042", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}, http.StatusUnauthorized},
		{"plus sign", map[string]any{"sub": "+42", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}, http.StatusUnauthorized},
		{"exp - iat over 24h", map[string]any{"sub": "42", "iat": now.Add(-time.Hour).Unix(), "exp": now.Add(24 * time.Hour).Unix()}, http.StatusUnauthorized},
		{"exp - now over 24h", map[string]any{"sub": "42", "exp": now.Add(48 * time.Hour).Unix()}, http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := s.Do("GET", path, hs256(t, tc.claims), nil)
			if r.Status != tc.status {
				t.Fatalf("status %d, want %d; body %s", r.Status, tc.status, r.Raw)
			}
		})
	}
}

// TestSecurityEdgeBinaryFrameRefused: a join sent as a binary frame is
// refused with close code 1003, even when its bytes are a valid join.
func TestSecurityEdgeBinaryFrameRefused(t *testing.T) {
	s := startStack(t)
	saleID, _ := s.createSale(1)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	url := strings.Replace(s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	msg, _ := json.Marshal(map[string]string{"type": "join", "accessToken": s.Token(7, false)})
	if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
		t.Fatal(err)
	}
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			if got := websocket.CloseStatus(err); got != websocket.StatusUnsupportedData {
				t.Fatalf("closed with %v (%v), want 1003", got, err)
			}
			return
		}
		var m struct{ Type, Error string }
		if json.Unmarshal(data, &m) == nil && m.Type != "error" {
			t.Fatalf("binary join answered %s, want an error and close 1003", data)
		}
	}
}
