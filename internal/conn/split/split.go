// Package split routes each connection of one listener by its first
// request head: WebSocket upgrades to Deps.Upgrade, everything else to an
// HTTP server's listener. The bytes read to decide are replayed to
// whoever gets the connection. It also
// bounds the wait for that first head (a first byte within
// FirstByteTimeout, the rest within HeadTimeout) and how many connections
// of one client address may wait at once.
//
// The package knows no route and no type of flashsale: of the module it
// imports only internal/conn/gopool, whose kept goroutines route the
// connections (layout_test.go). What a first head may not be, what wraps
// a connection given to the HTTP side and who answers an upgrade are its
// user's (Deps).
package split

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/conn/gopool"
)

// Config bounds the routing of new connections.
type Config struct {
	// MaxHead is the most bytes read to decide; a first head that does
	// not fit goes to the HTTP side, whose server refuses it.
	MaxHead int
	// FirstByteTimeout is the wait for a new connection's first byte (a
	// browser or client pool opens connections ahead of use);
	// HeadTimeout the wait, from it, for the rest of the first head. The
	// first is never shorter than the second.
	FirstByteTimeout, HeadTimeout time.Duration
	// MaxPendingPerAddr caps the connections of one client address (IPv6:
	// its /64) that have not sent a complete first head; 0: no cap.
	// Connections from TrustedProxies (a load balancer) are not capped.
	MaxPendingPerAddr int
	TrustedProxies    []netip.Prefix
}

// Deps are what the splitter calls; every field may be nil.
type Deps struct {
	// Refuse sees every complete first head before the connection is
	// routed; when it returns true it has answered and closed conn, and
	// no server sees the connection.
	Refuse func(conn net.Conn, head []byte) bool
	// WrapHTTP wraps each connection given to the HTTP side (its
	// timeouts).
	WrapHTTP func(net.Conn) net.Conn
	// Upgrade takes each WebSocket upgrade, in the goroutine that read
	// its head: head is the complete request head, valid only until
	// Upgrade returns, and conn replays any bytes the client sent after
	// it. Upgrade answers and either keeps conn or closes it. A server
	// reached this way parses the head once and starts no goroutine of
	// its own for the upgrade (each one a new stack grown through the
	// whole handshake). Without it an upgrade goes to HTTP like any head.
	Upgrade func(conn net.Conn, head []byte)
	// Refused counts the connections closed by MaxPendingPerAddr;
	// IdleTimeouts those that sent nothing within FirstByteTimeout,
	// HeadTimeouts those whose first head missed HeadTimeout.
	Refused, IdleTimeouts, HeadTimeouts prometheus.Counter
	Logger                              *slog.Logger
}

// Splitter routes the connections of one listener (Run) to HTTP and
// WebSocket until Close.
type Splitter struct {
	ln      net.Listener
	httpLn  *Listener
	maxHead int
	timeout time.Duration
	idle    time.Duration // wait for the first byte
	// maxPending caps the connections of one client address that have not
	// sent a complete first head; 0: no cap.
	maxPending int
	trusted    []netip.Prefix
	deps       Deps
	// timeouts count connections closed for sending nothing within idle
	// ([0]) and for a first head not complete within timeout of its
	// first byte ([1]); nil entries are not counted.
	timeouts [2]prometheus.Counter
	bufs     sync.Pool // of *[]byte, maxHead long
	// routes runs route: a goroutine kept from one connection to the
	// next has its stack grown already (an upgrade's handling is deep).
	routes *gopool.Pool

	mu      sync.Mutex
	closed  bool
	peeking sync.WaitGroup
	peeked  map[net.Conn]struct{} // connections in route, cut short by close
	pending map[netip.Addr]int    // connections in route by capKey of their peer
}

// New builds a splitter of ln's connections; Run starts it.
func New(ln net.Listener, cfg Config, deps Deps) *Splitter {
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	sp := &Splitter{
		ln:         ln,
		httpLn:     NewListener(ln.Addr()),
		maxHead:    cfg.MaxHead,
		timeout:    cfg.HeadTimeout,
		idle:       max(cfg.FirstByteTimeout, cfg.HeadTimeout),
		maxPending: max(cfg.MaxPendingPerAddr, 0),
		trusted:    cfg.TrustedProxies,
		deps:       deps,
		timeouts:   [2]prometheus.Counter{deps.IdleTimeouts, deps.HeadTimeouts},
		peeked:     make(map[net.Conn]struct{}),
		pending:    make(map[netip.Addr]int),
		routes:     gopool.New(routeIdle),
	}
	sp.bufs.New = func() any { b := make([]byte, cfg.MaxHead); return &b }
	return sp
}

// routeIdle is how long a routing goroutine waits for the next
// connection before it ends.
const routeIdle = 10 * time.Second

// HTTP is the listener of the connections whose first head is no
// WebSocket upgrade.
func (sp *Splitter) HTTP() net.Listener { return sp.httpLn }

// Run accepts until the listener is closed, then returns nil. Temporary
// accept errors (out of file descriptors) back off and retry.
func (sp *Splitter) Run() error {
	var delay time.Duration
	for {
		conn, err := sp.ln.Accept()
		if err != nil {
			if sp.isClosed() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			sp.deps.Logger.Warn("accept failed; retrying", "err", err, "delay", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		key, capped := sp.pendingKey(conn)
		sp.mu.Lock()
		if sp.closed {
			sp.mu.Unlock()
			_ = conn.Close()
			return nil
		}
		if capped && sp.pending[key] >= sp.maxPending {
			sp.mu.Unlock()
			if sp.deps.Refused != nil {
				sp.deps.Refused.Inc()
			}
			_ = conn.Close()
			continue
		}
		if capped {
			sp.pending[key]++
		}
		sp.peeking.Add(1)
		sp.peeked[conn] = struct{}{}
		sp.mu.Unlock()
		sp.routes.Go(func() { sp.route(conn, key, capped) })
	}
}

// pendingKey is the key conn counts under in the per-address cap of
// connections without a first head, and whether it is capped at all.
func (sp *Splitter) pendingKey(conn net.Conn) (netip.Addr, bool) {
	if sp.maxPending <= 0 {
		return netip.Addr{}, false
	}
	ta, ok := conn.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	a := ta.AddrPort().Addr().WithZone("").Unmap()
	if inPrefixes(a, sp.trusted) {
		return netip.Addr{}, false
	}
	return capKey(a), true
}

// capKey is what a per-address cap counts by: the address for IPv4, its
// /64 for IPv6 (one subscriber holds a whole /64, so its single
// addresses cost nothing to change).
func capKey(a netip.Addr) netip.Addr {
	if a.Is6() {
		if p, err := a.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return a
}

func inPrefixes(a netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// route reads the first request head (up to maxHead bytes) and hands conn
// to Deps.Upgrade or to HTTP. The first byte may take the idle timeout (a
// browser or client pool opens connections ahead of use, as keep-alive
// connections wait between requests); from the first byte, the head must
// be complete within the head timeout. A connection that misses either is
// closed. A complete first head goes to Deps.Refuse first. key and capped
// are the connection's place in the per-address cap (pendingKey).
func (sp *Splitter) route(conn net.Conn, key netip.Addr, capped bool) {
	defer func() {
		sp.mu.Lock()
		delete(sp.peeked, conn)
		if capped {
			if sp.pending[key]--; sp.pending[key] <= 0 {
				delete(sp.pending, key)
			}
		}
		sp.mu.Unlock()
		sp.peeking.Done()
	}()
	bp := sp.bufs.Get().(*[]byte)
	buf := *bp
	sp.setReadDeadline(conn, sp.idle)
	n, end := 0, -1
	for {
		m, err := conn.Read(buf[n:])
		if n == 0 && m > 0 {
			sp.setReadDeadline(conn, sp.timeout)
		}
		from := max(n-3, 0)
		n += m
		if e := headEnd(buf[from:n]); e >= 0 {
			end = from + e
			if sp.deps.Refuse != nil && sp.deps.Refuse(conn, buf[:end]) {
				sp.bufs.Put(bp)
				return
			}
			break
		}
		if n == len(buf) {
			break // too large: the HTTP side's server refuses it
		}
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() && !sp.isClosed() {
				if c := sp.timeouts[min(n, 1)]; c != nil {
					c.Inc()
				}
			}
			sp.bufs.Put(bp)
			_ = conn.Close()
			return
		}
	}
	_ = conn.SetReadDeadline(time.Time{})
	switch {
	case !isWebSocketUpgrade(buf[:n]), sp.deps.Upgrade == nil:
	case end < 0:
		// A head that did not fit goes to the HTTP side, which refuses it.
	default:
		var c net.Conn = conn
		if end < n {
			c = Replay(conn, bytes.Clone(buf[end:n]))
		}
		sp.deps.Upgrade(c, buf[:end])
		sp.bufs.Put(bp)
		return
	}
	pc := Replay(conn, bytes.Clone(buf[:n]))
	sp.bufs.Put(bp)
	if sp.deps.WrapHTTP != nil {
		pc = sp.deps.WrapHTTP(pc)
	}
	if !sp.httpLn.Deliver(pc) {
		_ = pc.Close()
	}
}

// Close stops accepting, ends the waits for first heads and closes both
// inner listeners.
func (sp *Splitter) Close() {
	sp.mu.Lock()
	sp.closed = true
	// A connection still waiting for its first head (up to the idle
	// timeout) carries no request yet: end the wait now.
	for c := range sp.peeked {
		_ = c.SetReadDeadline(time.Now())
	}
	sp.mu.Unlock()
	sp.routes.Close()
	_ = sp.ln.Close()
	_ = sp.httpLn.Close()
}

// setReadDeadline sets the read deadline of a connection in route to d from
// now, or to now once the splitter is closed. Close sets its deadlines
// under the same lock, so a wait route starts never outlasts Close.
func (sp *Splitter) setReadDeadline(conn net.Conn, d time.Duration) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	deadline := time.Now()
	if !sp.closed {
		deadline = deadline.Add(d)
	}
	_ = conn.SetReadDeadline(deadline)
}

func (sp *Splitter) isClosed() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.closed
}

// Wait waits, within ctx, for the connections still being routed and
// the goroutines that routed them; it is for after Close, once none
// waits longer than its next read.
func (sp *Splitter) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		sp.peeking.Wait()
		// Every Go of Run came before the Done of its route: none is left.
		sp.routes.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// headEnd is the index just past the blank line that ends a request head
// in b, or -1.
func headEnd(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if i+1 < len(b) && b[i+1] == '\n' {
			return i + 2
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			return i + 3
		}
	}
	return -1
}

// isWebSocketUpgrade reports whether the request head in b (possibly
// truncated) has an Upgrade header whose value lists the websocket
// protocol. Names and values are matched case-insensitively.
func isWebSocketUpgrade(b []byte) bool {
	if end := headEnd(b); end >= 0 {
		b = b[:end]
	}
	// Skip the request line.
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return false
	}
	b = b[i+1:]
	for len(b) > 0 {
		line := b
		if j := bytes.IndexByte(b, '\n'); j >= 0 {
			line, b = b[:j], b[j+1:]
		} else {
			b = nil
		}
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			return false // end of head
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(name, []byte("upgrade")) && HasWebSocketToken(value) {
			return true
		}
	}
	return false
}

// HasWebSocketToken reports whether an Upgrade header value lists the
// websocket protocol (case-insensitive, any version suffix). The
// splitter routes by it, and a server that gets an upgrade on a reused
// connection must hand it on by the same rule.
func HasWebSocketToken(value []byte) bool {
	for proto := range bytes.SplitSeq(value, []byte(",")) {
		proto = bytes.TrimSpace(proto)
		if k := bytes.IndexByte(proto, '/'); k >= 0 {
			proto = proto[:k] // websocket/13 style versions
		}
		if bytes.EqualFold(proto, []byte("websocket")) {
			return true
		}
	}
	return false
}

// Replay returns conn with head read first: the bytes read off conn
// before a server got it.
func Replay(conn net.Conn, head []byte) net.Conn {
	return &peekedConn{Conn: conn, head: head}
}

// peekedConn replays the bytes read while routing, then reads from the
// connection.
type peekedConn struct {
	net.Conn
	head []byte
}

// CloseWrite half-closes the connection, when it can be (a lingering
// close).
func (c *peekedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// SyscallConn is the socket's, once the replayed bytes are read: a
// caller that waits on the socket itself (a poller) must not miss them.
func (c *peekedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok || len(c.head) > 0 {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		if len(c.head) == 0 {
			c.head = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// Listener is an in-memory listener fed by Deliver.
type Listener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

// NewListener returns a listener whose Addr is addr.
func NewListener(addr net.Addr) *Listener {
	return &Listener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

// Accept returns the next delivered connection, or net.ErrClosed once l
// is closed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close ends Accept and Deliver; connections not delivered stay the
// caller's.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is the address New was given.
func (l *Listener) Addr() net.Addr { return l.addr }

// Deliver hands c to the server accepting on l, waiting for it; false
// once l is closed (c is then still the caller's to close).
func (l *Listener) Deliver(c net.Conn) bool {
	select {
	case <-l.done:
		return false
	default:
	}
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}
