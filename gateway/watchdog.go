package gateway

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// watchdog enforces the read, idle and write timeouts of the fiber side of
// the public port without a deadline per request. fasthttp's own
// ReadTimeout, IdleTimeout and WriteTimeout set up to three socket deadlines
// per request (each a clock read and a runtime timer change), a cost the
// refusal paths pay on every click of a flood. Here every connection
// records, on a coarse clock the watchdog advances every tick, when its
// current blocked Read or Write began and when its current request began;
// one goroutine closes the connections past a limit:
//
//   - read: a request whose first bytes arrived more than Read ago while
//     the server is still waiting for the rest of it (slow head or body);
//   - idle: a keep-alive connection waiting for its next request for more
//     than Idle;
//   - write: a Write blocked for more than Write (a client that does not
//     read its responses).
//
// A handler's own run time is not limited (no Read or Write is pending
// then); RequestTimeout bounds its calls. Limits are enforced to within one
// tick.
type watchdog struct {
	read, idle, write time.Duration
	tick              time.Duration
	closed            [numReasons]prometheus.Counter // by reason; nil entries are not counted

	clock atomic.Int64 // coarse now, Unix nanoseconds

	mu        sync.Mutex
	conns     map[*watchedConn]struct{}
	lingering map[*watchedConn]struct{} // in a lingering close
	ending    bool                      // no new lingering close: the server shuts down
	done      chan struct{}
	wg        sync.WaitGroup
	once      sync.Once
}

// Reasons a watched connection is closed (the label of
// flashsale_gateway_connections_timed_out_total).
const (
	reasonNone = iota
	reasonRead
	reasonIdle
	reasonWrite
	numReasons
)

var reasonNames = [numReasons]string{"", "read", "idle", "write"}

// newWatchdog starts a watchdog; closed counts the connections it closes
// by reason (nil: not counted).
func newWatchdog(read, idle, write time.Duration, closed *prometheus.CounterVec) *watchdog {
	tick := min(read, idle, write) / 8
	tick = min(max(tick, 10*time.Millisecond), time.Second)
	w := &watchdog{read: read, idle: idle, write: write, tick: tick,
		conns: make(map[*watchedConn]struct{}), lingering: make(map[*watchedConn]struct{}),
		done: make(chan struct{})}
	if closed != nil {
		for r := reasonRead; r < numReasons; r++ {
			w.closed[r] = closed.WithLabelValues(reasonNames[r])
		}
	}
	w.clock.Store(time.Now().UnixNano())
	w.wg.Add(1)
	go w.run()
	return w
}

// run advances the clock and closes the connections past a limit, every
// tick, until stop.
func (w *watchdog) run() {
	defer w.wg.Done()
	t := time.NewTicker(w.tick)
	defer t.Stop()
	type lateConn struct {
		c      *watchedConn
		reason int
	}
	var late []lateConn
	for {
		select {
		case <-w.done:
			return
		case now := <-t.C:
			ns := now.UnixNano()
			w.clock.Store(ns)
			late = late[:0]
			w.mu.Lock()
			for c := range w.conns {
				if r := c.late(ns, w); r != reasonNone {
					late = append(late, lateConn{c, r})
				}
			}
			w.mu.Unlock()
			for _, l := range late {
				if ctr := w.closed[l.reason]; ctr != nil {
					ctr.Inc() // before the close, which the client may see at once
				}
				_ = l.c.Close()
			}
		}
	}
}

// stop ends the watchdog's goroutine; connections stay open.
func (w *watchdog) stop() {
	w.once.Do(func() { close(w.done) })
	w.wg.Wait()
}

// watch wraps conn; the connection is watched until it is closed or
// released.
func (w *watchdog) watch(conn net.Conn) *watchedConn {
	c := &watchedConn{Conn: conn, w: w}
	w.mu.Lock()
	w.conns[c] = struct{}{}
	w.mu.Unlock()
	return c
}

func (w *watchdog) forget(c *watchedConn) {
	w.mu.Lock()
	delete(w.conns, c)
	w.mu.Unlock()
}

func (w *watchdog) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.conns)
}

// watchedConn is a connection the watchdog watches. The times are the
// watchdog's coarse clock; 0 means "not now".
type watchedConn struct {
	net.Conn
	w *watchdog

	reading  atomic.Int64 // a Read is blocked since
	writing  atomic.Int64 // a Write is blocked since
	reqStart atomic.Int64 // the current request's first bytes arrived at; 0: between requests
	released atomic.Bool
	linger   atomic.Bool // the next Close is a lingering one
	lines    reqLines    // where each request begins (framing of its request line)
}

func (c *watchedConn) Read(p []byte) (int, error) {
	c.reading.Store(c.w.clock.Load())
	n, err := c.Conn.Read(p)
	c.reading.Store(0)
	c.lines.feed(p[:n])
	if n > 0 && c.reqStart.Load() == 0 {
		c.reqStart.Store(c.w.clock.Load())
	}
	return n, err
}

func (c *watchedConn) Write(p []byte) (int, error) {
	c.writing.Store(c.w.clock.Load())
	n, err := c.Conn.Write(p)
	c.writing.Store(0)
	c.reqStart.Store(0) // a response went out: what is read next is a new request
	return n, err
}

// late returns the limit c is past at now, or reasonNone.
func (c *watchedConn) late(now int64, w *watchdog) int {
	if r := c.reading.Load(); r != 0 {
		if s := c.reqStart.Load(); s != 0 {
			if now-s > int64(w.read) {
				return reasonRead
			}
		} else if now-r > int64(w.idle) {
			return reasonIdle
		}
	}
	if wr := c.writing.Load(); wr != 0 && now-wr > int64(w.write) {
		return reasonWrite
	}
	return reasonNone
}

// release stops watching c without closing it (a connection handed over
// to the WebSocket server, which sets its own deadlines).
func (c *watchedConn) release() {
	if c.released.CompareAndSwap(false, true) {
		c.w.forget(c)
	}
}

func (c *watchedConn) Close() error {
	c.release()
	if c.linger.CompareAndSwap(true, false) && c.w.startLinger(c) {
		drain(c.Conn, time.Now().Add(lingerTime), lingerBytes)
		c.w.endLinger(c)
	}
	return c.Conn.Close()
}

// A lingering close. The server answers a request it refuses before
// reading it whole (a body over the limit, a head too large) and then
// closes the connection. Closing a socket whose input is unread makes the
// kernel reset the connection, and a client still sending its body then
// loses the answer before it reads it. So such a connection is half-closed
// first (the answer is followed by FIN), and what the client still sends
// is read and thrown away, up to lingerBytes or lingerTime, before the
// close; the client finishes its write and reads the answer. At most
// maxLingering connections linger at once (the others close at once), and
// none once the server shuts down.
const (
	lingerBytes  = 8 << 20
	lingerTime   = 5 * time.Second
	maxLingering = 256
)

// lingerOnClose makes c's next Close a lingering one.
func (c *watchedConn) lingerOnClose() { c.linger.Store(true) }

// startLinger registers c's lingering close, unless too many linger or the
// server shuts down.
func (w *watchdog) startLinger(c *watchedConn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ending || len(w.lingering) >= maxLingering {
		return false
	}
	w.lingering[c] = struct{}{}
	return true
}

func (w *watchdog) endLinger(c *watchedConn) {
	w.mu.Lock()
	delete(w.lingering, c)
	w.mu.Unlock()
}

// endLingers ends the lingering closes now and refuses new ones (the
// server shuts down: the clients' answers are theirs to have read).
func (w *watchdog) endLingers() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ending = true
	now := time.Now()
	for c := range w.lingering {
		_ = c.Conn.SetReadDeadline(now)
	}
}

// drain half-closes conn and reads what the client still sends, up to
// limit bytes or deadline. A connection that cannot be half-closed is not
// drained.
func drain(conn net.Conn, deadline time.Time, limit int64) {
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	if conn.SetReadDeadline(deadline) != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, conn, limit)
}
