package split

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// start runs a splitter of a new local listener until cleanup and
// returns it with the listener's address. Run's error is checked at
// cleanup.
func start(t *testing.T, cfg Config, deps Deps) (*Splitter, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxHead == 0 {
		cfg.MaxHead = 4 << 10
	}
	if cfg.FirstByteTimeout == 0 {
		cfg.FirstByteTimeout = time.Minute
	}
	if cfg.HeadTimeout == 0 {
		cfg.HeadTimeout = time.Minute
	}
	sp := New(ln, cfg, deps)
	ran := make(chan error, 1)
	go func() { ran <- sp.Run() }()
	t.Cleanup(func() {
		sp.Close()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return sp, ln.Addr().String()
}

// dial opens a connection to addr, closed at cleanup, and writes head.
func dial(t *testing.T, addr, head string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	return conn
}

// accept accepts one connection on ln and reads n bytes of it.
func accept(t *testing.T, ln net.Listener, n int) (net.Conn, string) {
	t.Helper()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	return c, string(b)
}

const (
	plainHead = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
	wsHead    = "GET /q HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
)

// wrapped marks the connections WrapHTTP saw.
type wrapped struct{ net.Conn }

func TestRoute(t *testing.T) {
	refuse := func(conn net.Conn, head []byte) bool {
		if !strings.HasPrefix(string(head), "BAD ") {
			return false
		}
		_, _ = io.WriteString(conn, "refused")
		_ = conn.Close()
		return true
	}
	upgrades := make(chan net.Conn, 1)
	sp, addr := start(t, Config{}, Deps{
		Refuse:   refuse,
		WrapHTTP: func(c net.Conn) net.Conn { return wrapped{c} },
		Upgrade:  func(c net.Conn, head []byte) { upgrades <- c },
	})

	t.Run("plain head goes to HTTP, replayed and wrapped", func(t *testing.T) {
		dial(t, addr, plainHead+"body")
		c, got := accept(t, sp.HTTP(), len(plainHead)+len("body"))
		if got != plainHead+"body" {
			t.Errorf("read %q, want %q", got, plainHead+"body")
		}
		if _, ok := c.(wrapped); !ok {
			t.Errorf("HTTP side got %T, want it wrapped by WrapHTTP", c)
		}
	})
	t.Run("upgrade goes to Upgrade, not wrapped", func(t *testing.T) {
		dial(t, addr, wsHead)
		select {
		case c := <-upgrades:
			defer c.Close()
			if _, ok := c.(wrapped); ok {
				t.Error("Upgrade got a connection wrapped by WrapHTTP")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Upgrade was not called")
		}
	})
	t.Run("without Upgrade an upgrade goes to HTTP", func(t *testing.T) {
		sp, addr := start(t, Config{}, Deps{})
		dial(t, addr, wsHead)
		if _, got := accept(t, sp.HTTP(), len(wsHead)); got != wsHead {
			t.Errorf("read %q, want %q", got, wsHead)
		}
	})
	t.Run("a refused head reaches no server", func(t *testing.T) {
		conn := dial(t, addr, "BAD / HTTP/1.1\r\n\r\n")
		b, err := io.ReadAll(conn)
		if err != nil || string(b) != "refused" {
			t.Errorf("read %q, %v; want %q and EOF", b, err, "refused")
		}
		// The next connection is the next one either server gets.
		dial(t, addr, plainHead)
		if _, got := accept(t, sp.HTTP(), len(plainHead)); got != plainHead {
			t.Errorf("read %q, want %q", got, plainHead)
		}
	})
	t.Run("a head larger than MaxHead goes to HTTP", func(t *testing.T) {
		sp, addr := start(t, Config{MaxHead: 16}, Deps{})
		dial(t, addr, plainHead)
		if _, got := accept(t, sp.HTTP(), len(plainHead)); got != plainHead {
			t.Errorf("read %q, want %q", got, plainHead)
		}
	})
}

// TestUpgradeHook: with Deps.Upgrade an upgrade is handed to it, in the
// routing goroutine, with its head alone; what the client sent after the
// head is read first from the connection it gets. A plain head and an
// upgrade head that does not fit MaxHead still go to HTTP.
func TestUpgradeHook(t *testing.T) {
	type upgraded struct {
		head, rest string
	}
	got := make(chan upgraded, 1)
	sp, addr := start(t, Config{}, Deps{Upgrade: func(conn net.Conn, head []byte) {
		rest := make([]byte, len("frame"))
		_, _ = io.ReadFull(conn, rest)
		got <- upgraded{head: string(head), rest: string(rest)}
		_ = conn.Close()
	}})
	dial(t, addr, wsHead+"frame")
	select {
	case u := <-got:
		if u.head != wsHead || u.rest != "frame" {
			t.Errorf("Upgrade got head %q then %q, want %q then %q", u.head, u.rest, wsHead, "frame")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Upgrade was not called")
	}
	dial(t, addr, plainHead)
	if _, g := accept(t, sp.HTTP(), len(plainHead)); g != plainHead {
		t.Errorf("HTTP read %q, want %q", g, plainHead)
	}
	sp, addr = start(t, Config{MaxHead: 32}, Deps{Upgrade: func(net.Conn, []byte) { t.Error("Upgrade got a head that did not fit") }})
	dial(t, addr, wsHead)
	if _, g := accept(t, sp.HTTP(), 32); g != wsHead[:32] {
		t.Errorf("HTTP read %q, want %q", g, wsHead[:32])
	}
}

// TestTimeouts: a connection that sends nothing within FirstByteTimeout,
// or whose first head is not complete HeadTimeout after its first byte,
// is closed and counted; no server gets it.
func TestTimeouts(t *testing.T) {
	for _, tc := range []struct {
		name, sent string
		idle, head float64
	}{
		{name: "silent", sent: "", idle: 1},
		{name: "partial head", sent: "GET / HTTP/1.1\r\n", head: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			idle := prometheus.NewCounter(prometheus.CounterOpts{Name: "idle_total"})
			head := prometheus.NewCounter(prometheus.CounterOpts{Name: "head_total"})
			reg.MustRegister(idle, head)
			_, addr := start(t, Config{FirstByteTimeout: 100 * time.Millisecond, HeadTimeout: 100 * time.Millisecond},
				Deps{IdleTimeouts: idle, HeadTimeouts: head})
			conn := dial(t, addr, tc.sent)
			if n, err := conn.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("read %d, %v; want EOF (closed by the splitter)", n, err)
			}
			if got := counted(t, reg, "idle_total"); got != tc.idle {
				t.Errorf("idle timeouts %v, want %v", got, tc.idle)
			}
			if got := counted(t, reg, "head_total"); got != tc.head {
				t.Errorf("head timeouts %v, want %v", got, tc.head)
			}
		})
	}
}

// TestPendingCap: one address may hold MaxPendingPerAddr connections
// without a first head; the next is closed at accept and counted, and a
// trusted proxy is not capped.
func TestPendingCap(t *testing.T) {
	reg := prometheus.NewRegistry()
	refused := prometheus.NewCounter(prometheus.CounterOpts{Name: "refused_total"})
	reg.MustRegister(refused)
	sp, addr := start(t, Config{MaxPendingPerAddr: 1}, Deps{Refused: refused})
	dial(t, addr, "")
	over := dial(t, addr, "")
	if n, err := over.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read %d, %v; want EOF (closed at accept)", n, err)
	}
	if got := counted(t, reg, "refused_total"); got != 1 {
		t.Errorf("refused %v, want 1", got)
	}
	if got := routing(sp); got != 1 {
		t.Errorf("%d connections routing, want 1", got)
	}

	trusted, addr := start(t, Config{MaxPendingPerAddr: 1, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, Deps{})
	dial(t, addr, "")
	dial(t, addr, "")
	waitRouting(t, trusted, 2)
}

// TestCloseEndsSilentWait: a connection that has sent nothing (it may
// wait up to FirstByteTimeout for its first byte) does not hold Close
// and Wait up.
func TestCloseEndsSilentWait(t *testing.T) {
	sp, addr := start(t, Config{FirstByteTimeout: time.Hour}, Deps{})
	dial(t, addr, "")
	waitRouting(t, sp, 1) // accepted and waiting for its first byte
	sp.Close()
	// The connection may stay silent for an hour; Wait fails with the
	// context's error if it waits for it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sp.Wait(ctx); err != nil {
		t.Fatalf("Wait with a silent connection open: %v", err)
	}
}

// routing is how many connections of sp are accepted and waiting for
// their first request head.
func routing(sp *Splitter) int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.peeked)
}

// waitRouting waits until n connections of sp are accepted and waiting
// for their first request head.
func waitRouting(t *testing.T, sp *Splitter, n int) {
	t.Helper()
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("%d connections routing, want %d", routing(sp), n) },
		30*time.Second, func() bool { return routing(sp) >= n })
}

// counted reads the counter name from reg.
func counted(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func TestListenerClosed(t *testing.T) {
	l := NewListener(&net.TCPAddr{})
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	_ = l.Close()
	if l.Deliver(a) {
		t.Error("Deliver on a closed listener = true, want false")
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept on a closed listener: %v, want net.ErrClosed", err)
	}
}

func TestIsWebSocketUpgrade(t *testing.T) {
	tests := []struct {
		name string
		head string
		want bool
	}{
		{"upgrade", "GET /q HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", true},
		{"case", "GET /q HTTP/1.1\r\nHOST: x\r\nupgrade: WebSocket\r\n\r\n", true},
		{"list", "GET /q HTTP/1.1\r\nUpgrade: h2c, websocket/13\r\n\r\n", true},
		{"bare LF", "GET /q HTTP/1.1\nUpgrade: websocket\n\n", true},
		{"plain", "GET /q HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"other protocol", "GET /q HTTP/1.1\r\nUpgrade: h2c\r\n\r\n", false},
		{"in body only", "POST /q HTTP/1.1\r\nContent-Length: 20\r\n\r\nUpgrade: websocket\r\n", false},
		{"in request line", "GET /Upgrade:websocket HTTP/1.1\r\n\r\n", false},
		{"other header value", "GET /q HTTP/1.1\r\nX-Note: Upgrade: websocket\r\n\r\n", false},
		{"truncated head", "GET /q HTTP/1.1\r\nUpgrade: websocket\r\nHost: x", true},
		{"empty", "", false},
	}
	for _, tt := range tests {
		if got := isWebSocketUpgrade([]byte(tt.head)); got != tt.want {
			t.Errorf("%s: isWebSocketUpgrade = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// FuzzIsWebSocketUpgrade checks the splitter's header detection against
// net/http's parse of the same head.
func FuzzIsWebSocketUpgrade(f *testing.F) {
	f.Add("GET /q HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	f.Add("GET /q HTTP/1.1\r\nHost: x\r\n\r\n")
	f.Add("GET /q HTTP/1.1\r\nHost: x\r\nUpgrade: h2c, WebSocket\r\n\r\n")
	f.Add("GET /q HTTP/1.1\nHost: x\nupgrade:websocket\n\n")
	f.Fuzz(func(t *testing.T, head string) {
		got := isWebSocketUpgrade([]byte(head))
		end := headEnd([]byte(head))
		if end < 0 {
			return
		}
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head[:end])))
		if err != nil {
			return
		}
		want := false
		for _, v := range req.Header.Values("Upgrade") {
			for p := range strings.SplitSeq(v, ",") {
				p, _, _ = strings.Cut(strings.TrimSpace(p), "/")
				want = want || strings.EqualFold(p, "websocket")
			}
		}
		if got != want {
			t.Fatalf("isWebSocketUpgrade(%q) = %v, net/http says %v", head, got, want)
		}
	})
}

// TestReplaySocket: a replaying connection gives its socket out only once
// the replayed bytes are read (a poller of the socket would miss them).
func TestReplaySocket(t *testing.T) {
	s, _ := testenv.TCPPair(t)
	pc := Replay(s, []byte("ab")).(syscall.Conn)
	if _, err := pc.SyscallConn(); err == nil {
		t.Fatal("the socket given out with replayed bytes unread")
	}
	if _, err := io.ReadFull(pc.(net.Conn), make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.SyscallConn(); err != nil {
		t.Fatalf("the socket withheld after the replay: %v", err)
	}
	if _, err := Replay(wrapped{s}, nil).(syscall.Conn).SyscallConn(); err == nil {
		t.Fatal("a socket given out through a connection that has none")
	}
}
