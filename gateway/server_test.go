package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// closeSignalListener closes closed when the server has closed it. The
// signal comes after the inner Close returns: a dial between the two
// would still land in the open listener's backlog.
type closeSignalListener struct {
	net.Listener
	once   sync.Once
	closed chan struct{}
}

func (l *closeSignalListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { close(l.closed) })
	return err
}

// serve runs e's gateway on a loopback port and returns its address.
func serve(t testing.TB, e *env) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Shutdown")
		}
	})
	return ln.Addr().String()
}

// echo is a WebSocket echo handler standing in for the waiting room.
func echo(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			return
		}
	}
}

// send writes request on a new connection to addr (closed at cleanup,
// 5 s to live) and returns a reader of the answer.
func send(t *testing.T, addr, request string) *bufio.Reader {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	return bufio.NewReader(conn)
}

// raw sends a raw request on a new connection and reads one response.
func raw(t *testing.T, addr, request string) resp {
	t.Helper()
	res, err := http.ReadResponse(send(t, addr, request), nil)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func TestSplitterOnePort(t *testing.T) {
	e := newEnv(t)
	e.queue.handler = http.HandlerFunc(echo)
	addr := serve(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("plain request goes to fiber", func(t *testing.T) {
		res, err := http.Get("http://" + addr + "/api/flash-sales/sales/1")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("got %d %q", res.StatusCode, res.Header.Get("Content-Type"))
		}
	})
	t.Run("websocket round trip goes to the queue handler", func(t *testing.T) {
		c, _, err := websocket.Dial(ctx, "ws://"+addr+"/api/flash-sales/sales/1/queue", &websocket.DialOptions{
			HTTPHeader: http.Header{"X-Forwarded-For": {"192.0.2.10"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		for i := range 3 {
			want := fmt.Sprintf(`{"type":"join","n":%d}`, i)
			if err := c.Write(ctx, websocket.MessageText, []byte(want)); err != nil {
				t.Fatal(err)
			}
			_, got, err := c.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Errorf("echo = %q, want %q", got, want)
			}
		}
		if got, _ := e.queue.lastAddr.Load().(string); !strings.HasPrefix(got, "192.0.2.10:") {
			t.Errorf("queue saw RemoteAddr %q, want the client address", got)
		}
		_ = c.Close(websocket.StatusNormalClosure, "")
	})
	t.Run("websocket from blocked address is refused before the queue", func(t *testing.T) {
		e.queue.lastAddr.Store("")
		_, res, err := websocket.Dial(ctx, "ws://"+addr+"/api/flash-sales/sales/1/queue", &websocket.DialOptions{
			HTTPHeader: http.Header{"X-Forwarded-For": {"203.0.113.5"}},
		})
		if err == nil || res == nil || res.StatusCode != 403 {
			t.Fatalf("dial: err %v, response %+v", err, res)
		}
		if got := e.queue.lastAddr.Load().(string); got != "" {
			t.Errorf("queue handler reached: %q", got)
		}
		// The sale's report counts the refusal, by rule.
		if got := e.queue.refusals(); got != "map[1/blocklist:1]" {
			t.Errorf("refusals counted = %s, want map[1/blocklist:1]", got)
		}
	})
	t.Run("websocket on another path is 404", func(t *testing.T) {
		_, res, err := websocket.Dial(ctx, "ws://"+addr+"/api/flash-sales/sales/1", nil)
		if err == nil || res == nil || res.StatusCode != 404 {
			t.Fatalf("dial: err %v, response %+v", err, res)
		}
	})
	t.Run("keep-alive connection keeps working", func(t *testing.T) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
		defer client.CloseIdleConnections()
		for range 5 {
			res, err := client.Get("http://" + addr + "/api/flash-sales/sales/2")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
		}
	})
}

func TestLimits(t *testing.T) {
	e := newEnv(t)
	addr := serve(t, e)
	user := e.token(7, false)
	adm := e.admit(7, 1)

	t.Run("body over the limit is 413 TOO_LARGE and reserves nothing", func(t *testing.T) {
		body := strings.Repeat("x", 17<<10)
		r := raw(t, addr, "POST /api/flash-sales/items/101/purchase HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+user+
			"\r\nX-Admission-Token: "+adm+fmt.Sprintf("\r\nContent-Length: %d\r\n\r\n", len(body))+body)
		if r.status != 413 || r.errCode() != "TOO_LARGE" {
			t.Errorf("got %d %s", r.status, r.body)
		}
		if n := e.purchase.calls.Load(); n != 0 {
			t.Errorf("Reserve called %d times", n)
		}
	})
	t.Run("a body of megabytes is read and dropped: the client finishes and reads its 413", func(t *testing.T) {
		// Far more than the socket buffers hold: without the lingering
		// close the server's close resets the connection mid-write.
		body := strings.Repeat("x", 4<<20)
		r := raw(t, addr, "POST /api/flash-sales/items/101/purchase HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+user+
			"\r\nX-Admission-Token: "+adm+fmt.Sprintf("\r\nContent-Length: %d\r\n\r\n", len(body))+body)
		if r.status != 413 || r.errCode() != "TOO_LARGE" {
			t.Errorf("got %d %s", r.status, r.body)
		}
		if n := e.purchase.calls.Load(); n != 0 {
			t.Errorf("Reserve called %d times", n)
		}
	})
	t.Run("admin body over the limit", func(t *testing.T) {
		body := `{"name":"` + strings.Repeat("x", 20<<10) + `"}`
		r := raw(t, addr, "POST /api/admin/sales HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body))+body)
		if r.status != 413 || r.errCode() != "TOO_LARGE" {
			t.Errorf("got %d %s", r.status, r.body)
		}
	})
	t.Run("header over the limit", func(t *testing.T) {
		r := raw(t, addr, "GET /api/flash-sales/sales/1 HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 9<<10)+"\r\n\r\n")
		if r.status != 431 || r.errCode() != "TOO_LARGE" {
			t.Errorf("got %d %s", r.status, r.body)
		}
	})
	t.Run("URL over the limit", func(t *testing.T) {
		r := raw(t, addr, "GET /api/flash-sales/sales/1?"+strings.Repeat("a", 9<<10)+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if r.status != 431 || r.errCode() != "TOO_LARGE" {
			t.Errorf("got %d %s", r.status, r.body)
		}
	})
	t.Run("garbage request", func(t *testing.T) {
		r := raw(t, addr, "BLAH\r\n\r\n")
		if r.status != 400 || r.errCode() != "INVALID" {
			t.Errorf("got %d %s", r.status, r.body)
		}
	})
}

// partialHead is a request head that never ends.
const partialHead = "GET /api/flash-sales/sales/1 HTTP/1.1\r\nHost: x\r\n"

// expectDropped opens a connection to addr, sends partial and expects the
// server to close it.
func expectDropped(t *testing.T, addr, partial string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, partial)
	// The read deadline only bounds a hang: a dropped connection reads
	// EOF, one the server kept open reads a timeout.
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := conn.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("partial %q: read %d, %v; want EOF", partial, n, err)
	}
}

func TestSlowClientDropped(t *testing.T) {
	e, reg := envWithMetrics(t, func(c *Config) {
		c.HeadTimeout = 200 * time.Millisecond
		// A connection that sends nothing waits the first-byte timeout,
		// however long keep-alive connections may idle.
		c.FirstByteTimeout = 400 * time.Millisecond
		c.IdleTimeout = time.Minute
	})
	addr := serve(t, e)
	for _, partial := range []string{"", partialHead} {
		expectDropped(t, addr, partial)
	}
	if h, i := timedOut(t, reg, "head"), timedOut(t, reg, "idle"); h != 1 || i != 1 {
		t.Errorf("timeouts counted: head %v, idle %v; want 1 and 1", h, i)
	}
}

func TestShutdownFinishesInFlight(t *testing.T) {
	e := newEnv(t)
	e.orders.block = make(chan struct{})
	e.orders.entered = make(chan struct{}, 1)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &closeSignalListener{Listener: inner, closed: make(chan struct{})}
	served := make(chan error, 1)
	go func() { served <- e.srv.Serve(ln) }()

	got := make(chan resp, 1)
	go func() {
		got <- raw(t, ln.Addr().String(), "GET /api/flash-sales/orders/"+orderA+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+e.token(7, false)+"\r\n\r\n")
	}()
	<-e.orders.entered

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- e.srv.Shutdown(ctx) }()
	// The request is still held, so the listener closes while it is in
	// flight.
	select {
	case <-ln.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not close the listener")
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Error("new connection accepted during shutdown")
	}
	close(e.orders.block)
	if r := <-got; r.status != 200 {
		t.Errorf("in-flight request: %d %s", r.status, r.body)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if err := e.srv.Serve(ln); err != nil {
		t.Errorf("Serve after Shutdown: %v", err)
	}
}

func TestServeAdmin(t *testing.T) {
	var ready error = errors.New("redis: connection refused")
	e := newEnv(t, func(c *Config, _ *Deps) {
		c.Ready = func(context.Context) error { return ready }
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.srv.ServeAdmin(ln) }()
	base := "http://" + ln.Addr().String()
	e.do("GET", "/api/flash-sales/sales/1", "") // one request for the metrics

	get := func(path string) (int, string) {
		t.Helper()
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "UNAVAILABLE") {
		t.Errorf("/readyz not ready = %d %s", code, body)
	}
	ready = nil
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz ready = %d", code)
	}
	code, body := get("/metrics")
	if code != 200 || !strings.Contains(body, `flashsale_gateway_requests_total{code="200",route="sale"} 1`) ||
		!strings.Contains(body, "flashsale_gateway_request_duration_seconds_bucket") {
		t.Errorf("/metrics = %d\n%s", code, body)
	}
	if code, _ := get("/debug/pprof/"); code != 200 {
		t.Errorf("pprof = %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("ServeAdmin: %v", err)
	}
}

// TestUpgradeOnReusedConnection: a proxy may reuse a keep-alive connection
// (already split to fiber) for a WebSocket upgrade; fiber hands it on.
func TestUpgradeOnReusedConnection(t *testing.T) {
	e := newEnv(t)
	e.queue.handler = http.HandlerFunc(echo)
	addr := serve(t, e)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)

	_, _ = io.WriteString(conn, "GET /api/flash-sales/sales/1 HTTP/1.1\r\nHost: x\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("first request: %d", res.StatusCode)
	}

	_, _ = io.WriteString(conn, "GET /api/flash-sales/sales/1/queue HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Forwarded-For: 192.0.2.44\r\n\r\n")
	res, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("upgrade: %d %v", res.StatusCode, res.Header)
	}
	if got, _ := e.queue.lastAddr.Load().(string); !strings.HasPrefix(got, "192.0.2.44:") {
		t.Errorf("queue saw RemoteAddr %q", got)
	}
	// One masked text frame "hi"; the echo comes back unmasked.
	mask := []byte{1, 2, 3, 4}
	frame := []byte{0x81, 0x80 | 2, mask[0], mask[1], mask[2], mask[3], 'h' ^ mask[0], 'i' ^ mask[1]}
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(br, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != "\x81\x02hi" {
		t.Errorf("echo frame = %q", got)
	}
}

// TestUpgradeAnswersWithoutAServer: an upgrade the splitter routes is
// answered on its connection by serveUpgrade. A refusal is one whole
// answer (the contract's body, its length, Connection: close) and the
// connection then ends; a head net/http cannot parse is 400 INVALID; a
// frame the client sent in the same write as its head reaches the handler
// after the 101.
func TestUpgradeAnswersWithoutAServer(t *testing.T) {
	e := newEnv(t)
	e.queue.handler = http.HandlerFunc(echo)
	addr := serve(t, e)
	const upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	refused := func(t *testing.T, request string, status int, code string) {
		t.Helper()
		br := send(t, addr, request)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != status || res.ContentLength != int64(len(body)) || !res.Close {
			t.Fatalf("got %d, Content-Length %d for %d bytes, close %v", res.StatusCode, res.ContentLength, len(body), res.Close)
		}
		var eb struct{ Error, Message string }
		if err := json.Unmarshal(body, &eb); err != nil || eb.Error != code || eb.Message == "" {
			t.Fatalf("body %s: want error %s with a message", body, code)
		}
		if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("after the answer: read %d, %v; want the connection closed", n, err)
		}
	}
	t.Run("another path is 404 and the connection ends", func(t *testing.T) {
		refused(t, "GET /api/flash-sales/sales/1/other HTTP/1.1\r\nHost: x\r\n"+upgrade+"\r\n", 404, "NOT_FOUND")
	})
	t.Run("a bad sale id is 400", func(t *testing.T) {
		refused(t, "GET /api/flash-sales/sales/x1/queue HTTP/1.1\r\nHost: x\r\n"+upgrade+"\r\n", 400, "INVALID")
	})
	t.Run("a head net/http cannot parse is 400", func(t *testing.T) {
		refused(t, "GET /api/flash-sales/sales/1/queue HTTP/9\r\nHost: x\r\n"+upgrade+"\r\n", 400, "INVALID")
	})
	t.Run("a frame sent with the head is read after the 101", func(t *testing.T) {
		mask := []byte{1, 2, 3, 4}
		frame := []byte{0x81, 0x80 | 2, mask[0], mask[1], mask[2], mask[3], 'h' ^ mask[0], 'i' ^ mask[1]}
		head := "GET /api/flash-sales/sales/1/queue HTTP/1.1\r\nHost: x\r\n" + upgrade + "\r\n"
		br := send(t, addr, head+string(frame)) // one write: the splitter reads both
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
			t.Fatalf("upgrade: %d %v", res.StatusCode, res.Header)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(br, got); err != nil {
			t.Fatal(err)
		}
		if string(got) != "\x81\x02hi" {
			t.Errorf("echo frame = %q", got)
		}
	})
}

// TestPreconnectedConnectionServed: a connection opened ahead of use (as
// browsers and client pools do) may stay silent past the head timeout, up
// to the idle timeout, and is then served.
func TestPreconnectedConnectionServed(t *testing.T) {
	e := newEnv(t, func(c *Config, _ *Deps) {
		c.HeadTimeout = 200 * time.Millisecond
		c.IdleTimeout = 5 * time.Second
	})
	addr := serve(t, e)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Three connections opened after this one are dropped, one after the
	// other, by the head timeout: this one has stayed silent past three.
	for range 3 {
		expectDropped(t, addr, partialHead)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, saleReq); err != nil {
		t.Fatal(err)
	}
	readResponse(t, bufio.NewReader(conn))
}
