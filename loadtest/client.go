package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// maxSourceAddrs keeps shopper addresses (from 127.0.0.2) clear of the
// one-address hostile shoppers' 127.1.0.1.
const maxSourceAddrs = 65_000

// oneAddrIP is the single source address of Hostile.OneAddrUsers.
var oneAddrIP = net.IPv4(127, 1, 0, 1)

// sourceAddr returns the i-th client source address: 127.0.0.2, 127.0.0.3, …
// carrying into the next octets (127.0.1.0 follows 127.0.0.255).
func sourceAddr(i int) net.IP {
	n := 2 + i
	return net.IPv4(127, byte(n>>16), byte(n>>8), byte(n))
}

// requestTimeout bounds every single HTTP request of the tool.
const requestTimeout = 30 * time.Second

// httpClient is one source address's pair of clients: net/http for the
// WebSocket dial (coder/websocket hijacks its connection) and fasthttp for
// every API request. fasthttp sends and reads in the caller's goroutine
// and reuses its buffers, where net/http's two goroutines per connection
// and allocations per request would take CPU from the gateways the tool
// loads, on the same cores.
type httpClient struct {
	ws  *http.Client
	api *fasthttp.Client
}

// wsIdle caps the idle connections of the WebSocket-dial client: a
// successful dial hijacks its connection, so only refused upgrades (a 429,
// a 503) ever leave one idle.
const wsIdle = 256

func newHTTPClient(local net.IP) *httpClient {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if local != nil {
		d.LocalAddr = &net.TCPAddr{IP: local}
		d.Control = bindNoPort
	}
	return &httpClient{
		ws: &http.Client{Transport: &http.Transport{
			DialContext:           d.DialContext,
			MaxIdleConns:          0, // no global cap
			MaxIdleConnsPerHost:   wsIdle,
			IdleConnTimeout:       30 * time.Second,
			ResponseHeaderTimeout: requestTimeout,
			DisableCompression:    true,
			ForceAttemptHTTP2:     false,
		}},
		api: &fasthttp.Client{
			Dial: func(addr string) (net.Conn, error) { return d.Dial("tcp", addr) },
			// Connections are bounded by the open-file limit, not here.
			MaxConnsPerHost: 1 << 20,
			// Below the gateway's 60 s idle timeout, so the server never
			// closes a connection the client is about to reuse.
			MaxIdleConnDuration:    30 * time.Second,
			MaxResponseBodySize:    maxBody,
			DisablePathNormalizing: true,
		},
	}
}

func (c *httpClient) closeIdle() {
	c.ws.CloseIdleConnections()
	c.api.CloseIdleConnections()
}

// clients holds one httpClient per source address (so each shopper keeps
// one address), sharing nothing, plus the one-address hostile client.
type clients struct {
	bases   []string
	byAddr  []*httpClient // index: source address; len 1 with no binding
	oneAddr *httpClient
}

func newClients(bases []string, sourceAddrs int) *clients {
	n := max(sourceAddrs, 1)
	c := &clients{bases: bases, byAddr: make([]*httpClient, n)}
	for i := range c.byAddr {
		var ip net.IP
		if sourceAddrs > 0 {
			ip = sourceAddr(i)
		}
		c.byAddr[i] = newHTTPClient(ip)
	}
	c.oneAddr = newHTTPClient(oneAddrIP)
	return c
}

// forUser returns the client and base URL a shopper uses: gateways are
// assigned round-robin by user index, and addresses round-robin within
// each gateway's share, so every address reaches every gateway (with
// idx%addrs for both, an even address count over two gateways would send
// each address to one gateway only and hit its per-address connection cap
// at half the intended spread).
func (c *clients) forUser(idx int) (*httpClient, string) {
	nb := len(c.bases)
	return c.byAddr[(idx/nb)%len(c.byAddr)], c.bases[idx%nb]
}

func (c *clients) close() {
	for _, h := range append(c.byAddr, c.oneAddr) {
		h.closeIdle()
	}
}

// apiResult is one decoded API answer.
type apiResult struct {
	Status     int
	Code       string // "error" field of an error body
	Body       []byte
	RetryAfter time.Duration
	// HasRetryAfter says the answer carried a Retry-After header (a 503
	// without one is a server fault, with one a documented refusal).
	HasRetryAfter bool
}

// busy reports a 429 or 503: the server asks to come back later.
func (r apiResult) busy() bool {
	return r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable
}

// outcome is the label of a response in the report: "202", "410 SOLD_OUT".
func (r apiResult) outcome() string {
	s := strconv.Itoa(r.Status)
	if r.Code != "" {
		s += " " + r.Code
	}
	return s
}

const maxBody = 1 << 20

// do sends one request and reads the whole (bounded) answer, within
// requestTimeout and ctx's deadline. fasthttp takes no context: a request
// already sent when ctx is cancelled runs to its answer or its deadline.
func do(ctx context.Context, c *httpClient, method, url string, hdr map[string]string, body any) (apiResult, error) {
	if err := ctx.Err(); err != nil {
		return apiResult{}, err
	}
	deadline := time.Now().Add(requestTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(method)
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return apiResult{}, err
		}
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(b)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if err := c.api.DoDeadline(req, resp, deadline); err != nil {
		if errors.Is(err, fasthttp.ErrTimeout) && ctx.Err() != nil {
			return apiResult{}, ctx.Err()
		}
		return apiResult{}, err
	}
	r := apiResult{Status: resp.StatusCode(), Body: append([]byte(nil), resp.Body()...)}
	if r.Status >= 300 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(r.Body, &e) == nil {
			r.Code = e.Error
		}
	}
	if ra := resp.Header.Peek("Retry-After"); len(ra) > 0 {
		r.HasRetryAfter = true
		if s, err := strconv.Atoi(string(ra)); err == nil && s >= 0 {
			r.RetryAfter = time.Duration(s) * time.Second
		}
	}
	return r, nil
}

// errOutcome is the label of a transport error.
func errOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case isTimeout(err):
		return "timeout"
	case strings.Contains(err.Error(), "connection refused"):
		return "conn_refused"
	case strings.Contains(err.Error(), "connection reset"):
		return "conn_reset"
	case strings.Contains(err.Error(), "too many open files"):
		return "too_many_open_files"
	case strings.Contains(err.Error(), "cannot assign requested address"):
		return "no_ephemeral_port"
	default:
		return "conn_error"
	}
}

// gatewayGone reports a transport error after which a shopper tries
// another gateway: the connection was refused, reset or broken, or the
// answer never came. Local shortages (files, ports) and cancellation are
// not the gateway's doing.
func gatewayGone(err error) bool {
	switch errOutcome(err) {
	case "conn_refused", "conn_reset", "conn_error", "timeout":
		return true
	}
	return false
}

func isTimeout(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout)
}

func bearer(tok string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + tok}
}

func wsURL(base string) string {
	switch {
	case strings.HasPrefix(base, "https://"):
		return "wss://" + strings.TrimPrefix(base, "https://")
	case strings.HasPrefix(base, "http://"):
		return "ws://" + strings.TrimPrefix(base, "http://")
	}
	return base
}

func queuePath(saleID int64) string {
	return fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
}
