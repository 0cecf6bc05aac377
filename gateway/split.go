package gateway

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// splitter routes each connection of one listener by its first request
// head: WebSocket upgrades to wsLn (net/http), everything else to httpLn
// (fiber). The bytes read to decide are replayed to the server that gets
// the connection. Connections given to fiber are watched by wd (the read,
// idle and write timeouts).
type splitter struct {
	ln      net.Listener
	httpLn  *chanListener
	wsLn    *chanListener
	maxHead int
	timeout time.Duration
	wd      *watchdog
	log     *slog.Logger
	idle    time.Duration // wait for the first byte
	// maxPending caps the connections of one client address (IPv6: its
	// /64) that have not sent a complete first head; 0: no cap.
	// Connections from trusted prefixes (a load balancer) are not capped.
	maxPending int
	trusted    []netip.Prefix
	refused    prometheus.Counter // connections closed by maxPending; nil: not counted
	// timeouts count connections closed for sending nothing within idle
	// ([0]) and for a first head not complete within timeout of its
	// first byte ([1]); nil entries are not counted.
	timeouts [2]prometheus.Counter
	bufs     sync.Pool // of *[]byte, maxHead long

	mu      sync.Mutex
	closed  bool
	peeking sync.WaitGroup
	peeked  map[net.Conn]struct{} // connections in route, cut short by close
	pending map[netip.Addr]int    // connections in route by capKey of their peer
}

// newSplitter builds a splitter; idle is the wait for a new connection's
// first byte, timeout the wait for the rest of its first head.
func newSplitter(ln net.Listener, maxHead int, idle, timeout time.Duration, wd *watchdog, log *slog.Logger) *splitter {
	sp := &splitter{
		ln:      ln,
		httpLn:  newChanListener(ln.Addr()),
		wsLn:    newChanListener(ln.Addr()),
		maxHead: maxHead,
		timeout: timeout,
		idle:    max(idle, timeout),
		wd:      wd,
		log:     log,
		peeked:  make(map[net.Conn]struct{}),
		pending: make(map[netip.Addr]int),
	}
	sp.bufs.New = func() any { b := make([]byte, maxHead); return &b }
	return sp
}

// run accepts until the listener is closed. Temporary accept errors (out
// of file descriptors) back off and retry.
func (sp *splitter) run() error {
	var delay time.Duration
	for {
		conn, err := sp.ln.Accept()
		if err != nil {
			if sp.isClosed() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			sp.log.Warn("accept failed; retrying", "err", err, "delay", delay)
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
			if sp.refused != nil {
				sp.refused.Inc()
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
		go sp.route(conn, key, capped)
	}
}

// pendingKey is the key conn counts under in the per-address cap of
// connections without a first head, and whether it is capped at all.
func (sp *splitter) pendingKey(conn net.Conn) (netip.Addr, bool) {
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
// to one of the two servers. The first byte may take the idle timeout (a
// browser or client pool opens connections ahead of use, as keep-alive
// connections wait between requests); from the first byte, the head must
// be complete within the head timeout. A connection that misses either is
// closed. A first head whose framing is unsafe (badFirstHead) is answered
// 400 here and its connection closed. key and capped are the connection's
// place in the per-address cap (pendingKey).
func (sp *splitter) route(conn net.Conn, key netip.Addr, capped bool) {
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
	n := 0
	for {
		m, err := conn.Read(buf[n:])
		if n == 0 && m > 0 {
			sp.setReadDeadline(conn, sp.timeout)
		}
		from := max(n-3, 0)
		n += m
		if e := headEnd(buf[from:n]); e >= 0 {
			if why := badFirstHead(buf[:from+e]); why != "" {
				sp.bufs.Put(bp)
				sp.refuse(conn, why)
				return
			}
			break
		}
		if n == len(buf) {
			break // too large: fiber answers 431
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
	target := sp.httpLn
	if isWebSocketUpgrade(buf[:n]) {
		target = sp.wsLn
	}
	var pc net.Conn = &peekedConn{Conn: conn, head: bytes.Clone(buf[:n])}
	sp.bufs.Put(bp)
	if target == sp.httpLn && sp.wd != nil {
		pc = sp.wd.watch(pc)
	}
	if !target.deliver(pc) {
		_ = pc.Close()
	}
}

// refuse answers a connection whose first head badFirstHead refused with
// 400 and Connection: close, then closes it. What the client sent after
// the head (the smuggled request) is read and dropped for a short while
// first: closing a socket with unread data resets the connection, and the
// client could lose the answer.
func (sp *splitter) refuse(conn net.Conn, why string) {
	_ = conn.SetWriteDeadline(time.Now().Add(refusalLinger))
	if _, err := conn.Write(framingRefusal(why)); err == nil {
		drain(conn, time.Now().Add(refusalLinger), 64<<10)
	}
	_ = conn.Close()
}

// close stops accepting, ends the waits for first heads and closes both
// inner listeners.
func (sp *splitter) close() {
	sp.mu.Lock()
	sp.closed = true
	// A connection still waiting for its first head (up to the idle
	// timeout) carries no request yet: end the wait now.
	for c := range sp.peeked {
		_ = c.SetReadDeadline(time.Now())
	}
	sp.mu.Unlock()
	if sp.wd != nil {
		sp.wd.endLingers()
	}
	_ = sp.ln.Close()
	_ = sp.httpLn.Close()
	_ = sp.wsLn.Close()
}

// setReadDeadline sets the read deadline of a connection in route to d from
// now, or to now once the splitter is closed. close sets its deadlines
// under the same lock, so a wait route starts never outlasts close.
func (sp *splitter) setReadDeadline(conn net.Conn, d time.Duration) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	deadline := time.Now()
	if !sp.closed {
		deadline = deadline.Add(d)
	}
	_ = conn.SetReadDeadline(deadline)
}

func (sp *splitter) isClosed() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.closed
}

// wait waits for the connections being peeked, within ctx.
func (sp *splitter) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { sp.peeking.Wait(); close(done) }()
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
		if ok && bytes.EqualFold(name, []byte("upgrade")) && hasWebSocketToken(value) {
			return true
		}
	}
	return false
}

// hasWebSocketToken reports whether an Upgrade header value lists the
// websocket protocol (case-insensitive, any version suffix).
func hasWebSocketToken(value []byte) bool {
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

// chanListener is an in-memory listener fed by deliver.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// deliver hands c to the server accepting on l; false once l is closed.
func (l *chanListener) deliver(c net.Conn) bool {
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
