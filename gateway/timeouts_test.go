package gateway

// The gateway's timeouts end to end: the watchdog (internal/conn/watchdog)
// on the connections the splitter gives fiber, counted on the gateway's
// metrics.

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const saleReq = "GET /api/flash-sales/sales/1 HTTP/1.1\r\nHost: x\r\n\r\n"

// readResponse reads one HTTP response from br and fails unless it is 200.
func readResponse(t *testing.T, br *bufio.Reader) {
	t.Helper()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
}

// waitClosed waits for the server to close conn. Its deadline only
// keeps a broken watchdog from hanging the test: which rule closed the
// connection is read from the timeout counters, and when each rule fires
// is internal/conn/watchdog's TestWatchdogLate.
func waitClosed(t *testing.T, conn net.Conn, br *bufio.Reader) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
	n, err := br.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read %d, %v; want EOF (connection closed by the server)", n, err)
	}
}

// envWithMetrics is newEnv with tweak applied to the Config and the
// gateway's metrics in a registry of the test's.
func envWithMetrics(t *testing.T, tweak func(*Config)) (*env, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config, d *Deps) {
		d.Metrics = reg
		tweak(c)
	})
	return e, reg
}

// dialServed serves a gateway configured by tweak on a real listener and
// returns its metrics registry and one client connection (closed at
// cleanup) with a reader.
func dialServed(t *testing.T, tweak func(*Config)) (*prometheus.Registry, net.Conn, *bufio.Reader) {
	t.Helper()
	e, reg := envWithMetrics(t, tweak)
	conn, err := net.Dial("tcp", serve(t, e))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return reg, conn, bufio.NewReader(conn)
}

func TestWatchdogIdleKeepAlive(t *testing.T) {
	reg, conn, br := dialServed(t, func(c *Config) {
		c.IdleTimeout = 300 * time.Millisecond
		c.ReadTimeout = 5 * time.Second
	})
	for range 3 { // keep-alive works while the client is busy
		if _, err := io.WriteString(conn, saleReq); err != nil {
			t.Fatal(err)
		}
		readResponse(t, br)
	}
	waitClosed(t, conn, br)
	if n := timedOut(t, reg, "idle"); n != 1 {
		t.Errorf("idle timeouts counted: %v, want 1", n)
	}
}

// timedOut reads flashsale_gateway_connections_timed_out_total{reason}.
func timedOut(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "flashsale_gateway_connections_timed_out_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestWatchdogSlowRequestOnKeepAlive(t *testing.T) {
	reg, conn, br := dialServed(t, func(c *Config) {
		c.IdleTimeout = time.Minute
		c.ReadTimeout = 300 * time.Millisecond
	})
	if _, err := io.WriteString(conn, saleReq); err != nil {
		t.Fatal(err)
	}
	readResponse(t, br)
	// The second request's head trickles in and never ends: the read
	// timeout applies from its first byte, not the minute of idle time.
	done := make(chan struct{})
	defer close(done)
	go func() {
		for _, part := range strings.SplitAfter(saleReq[:len(saleReq)-2], "\n") {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := io.WriteString(conn, part); err != nil {
				return
			}
		}
	}()
	waitClosed(t, conn, br)
	if n := timedOut(t, reg, "read"); n != 1 {
		t.Errorf("read timeouts counted: %v, want 1", n)
	}
}

func TestWatchdogSlowHandlerNotCut(t *testing.T) {
	e, reg := envWithMetrics(t, func(c *Config) { c.ReadTimeout = 200 * time.Millisecond })
	e.orders.block = make(chan struct{})
	e.orders.entered = make(chan struct{}, 1)
	addr := serve(t, e)
	got := make(chan resp, 1)
	go func() {
		got <- raw(t, addr, "GET /api/flash-sales/orders/"+orderA+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+e.token(7, false)+"\r\n\r\n")
	}()
	<-e.orders.entered
	// While the handler runs, a second (keep-alive) connection sends half
	// of its second request head: once the read timeout has cut it, the
	// handler has outlived a whole read timeout.
	canary, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer canary.Close()
	br := bufio.NewReader(canary)
	if _, err := io.WriteString(canary, saleReq); err != nil {
		t.Fatal(err)
	}
	readResponse(t, br)
	if _, err := io.WriteString(canary, saleReq[:len(saleReq)-2]); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, canary, br)
	if n := timedOut(t, reg, "read"); n != 1 {
		t.Fatalf("read timeouts counted: %v, want 1 (the half-sent head)", n)
	}
	close(e.orders.block)
	if r := <-got; r.status != http.StatusOK {
		t.Errorf("slow handler: %d %s", r.status, r.body)
	}
}

func TestWatchdogClientNotReading(t *testing.T) {
	e, reg := envWithMetrics(t, func(c *Config) { c.WriteTimeout = 300 * time.Millisecond })
	addr := serve(t, e)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	// Pipeline requests and never read: once the socket buffers are full
	// the server's Write blocks, and the watchdog closes the connection,
	// which ends this writer with an error.
	_ = conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
	batch := []byte(strings.Repeat(saleReq, 256))
	start := time.Now()
	for {
		if _, err := conn.Write(batch); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("server still reading after %v: the blocked write was not cut", time.Since(start))
			}
			break
		}
	}
	if n := timedOut(t, reg, "write"); n != 1 {
		t.Errorf("write timeouts counted: %v, want 1", n)
	}
}
