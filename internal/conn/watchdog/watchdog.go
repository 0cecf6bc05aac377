// Package watchdog enforces the read, idle and write timeouts of an HTTP
// server's connections without a socket deadline per request, and closes
// a connection that refused an unread request with a lingering close.
//
// fasthttp's own ReadTimeout, IdleTimeout and WriteTimeout set up to three
// socket deadlines per request (each a clock read and a runtime timer
// change), a cost the refusal paths pay on every click of a flood. Here
// every connection records, on a coarse clock the watchdog advances every
// tick, when its current blocked Read or Write began and when its current
// request began; one goroutine closes the connections past a limit:
//
//   - read: a request whose first bytes arrived more than Read ago while
//     the server is still waiting for the rest of it (slow head or body);
//   - idle: a keep-alive connection waiting for its next request for more
//     than Idle;
//   - write: a Write blocked for more than Write (a client that does not
//     read its responses).
//
// A handler's own run time is not limited (no Read or Write is pending
// then); the server bounds its calls. Limits are enforced to within one
// tick. The package knows no route and no type of flashsale: it imports
// nothing of the module (layout_test.go).
package watchdog

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config holds the three limits; each must be positive.
type Config struct {
	Read, Idle, Write time.Duration
}

// Watchdog watches the connections given to Watch until Stop.
type Watchdog struct {
	read, idle, write time.Duration
	tick              time.Duration
	closed            [numReasons]prometheus.Counter // by reason; nil entries are not counted

	clock atomic.Int64 // coarse now, Unix nanoseconds

	mu        sync.Mutex
	conns     map[*Conn]struct{}
	lingering map[*Conn]struct{} // in a lingering close
	ending    bool               // no new lingering close: the server shuts down
	done      chan struct{}
	wg        sync.WaitGroup
	once      sync.Once
}

// Reasons a watched connection is closed: the values of the reason label
// of the counter New takes.
const (
	reasonNone = iota
	reasonRead
	reasonIdle
	reasonWrite
	numReasons
)

var reasonNames = [numReasons]string{"", "read", "idle", "write"}

// New starts a watchdog; closed counts the connections it closes, by a
// reason label of "read", "idle" or "write" (nil: not counted). The tick
// is an eighth of the smallest limit, within 10 ms and 1 s.
func New(cfg Config, closed *prometheus.CounterVec) *Watchdog {
	tick := min(cfg.Read, cfg.Idle, cfg.Write) / 8
	tick = min(max(tick, 10*time.Millisecond), time.Second)
	w := &Watchdog{read: cfg.Read, idle: cfg.Idle, write: cfg.Write, tick: tick,
		conns: make(map[*Conn]struct{}), lingering: make(map[*Conn]struct{}),
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
// tick, until Stop.
func (w *Watchdog) run() {
	defer w.wg.Done()
	t := time.NewTicker(w.tick)
	defer t.Stop()
	type lateConn struct {
		c      *Conn
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

// Stop ends the watchdog's goroutine; connections stay open.
func (w *Watchdog) Stop() {
	w.once.Do(func() { close(w.done) })
	w.wg.Wait()
}

// Watch wraps conn; the connection is watched until it is closed or
// released.
func (w *Watchdog) Watch(conn net.Conn) *Conn {
	c := &Conn{Conn: conn, w: w}
	w.mu.Lock()
	w.conns[c] = struct{}{}
	w.mu.Unlock()
	return c
}

func (w *Watchdog) forget(c *Conn) {
	w.mu.Lock()
	delete(w.conns, c)
	w.mu.Unlock()
}

func (w *Watchdog) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.conns)
}

// Conn is a connection the watchdog watches. The times are the
// watchdog's coarse clock; 0 means "not now".
type Conn struct {
	net.Conn
	w *Watchdog

	reading  atomic.Int64 // a Read is blocked since
	writing  atomic.Int64 // a Write is blocked since
	reqStart atomic.Int64 // the current request's first bytes arrived at; 0: between requests
	released atomic.Bool
	linger   atomic.Bool // the next Close is a lingering one
}

func (c *Conn) Read(p []byte) (int, error) {
	c.reading.Store(c.w.clock.Load())
	n, err := c.Conn.Read(p)
	c.reading.Store(0)
	if n > 0 && c.reqStart.Load() == 0 {
		c.reqStart.Store(c.w.clock.Load())
	}
	return n, err
}

func (c *Conn) Write(p []byte) (int, error) {
	c.writing.Store(c.w.clock.Load())
	n, err := c.Conn.Write(p)
	c.writing.Store(0)
	c.reqStart.Store(0) // a response went out: what is read next is a new request
	return n, err
}

// late returns the limit c is past at now, or reasonNone.
func (c *Conn) late(now int64, w *Watchdog) int {
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

// Release stops watching c without closing it (a connection handed over
// to a server that sets its own deadlines).
func (c *Conn) Release() {
	if c.released.CompareAndSwap(false, true) {
		c.w.forget(c)
	}
}

// Close releases c and closes it, lingering first when LingerOnClose
// asked for it.
func (c *Conn) Close() error {
	c.Release()
	if c.linger.CompareAndSwap(true, false) && c.w.startLinger(c) {
		Drain(c.Conn, time.Now().Add(lingerTime), lingerBytes)
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

// LingerOnClose makes c's next Close a lingering one: the server refused
// a request it did not read whole.
func (c *Conn) LingerOnClose() { c.linger.Store(true) }

// startLinger registers c's lingering close, unless too many linger or the
// server shuts down.
func (w *Watchdog) startLinger(c *Conn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ending || len(w.lingering) >= maxLingering {
		return false
	}
	w.lingering[c] = struct{}{}
	return true
}

func (w *Watchdog) endLinger(c *Conn) {
	w.mu.Lock()
	delete(w.lingering, c)
	w.mu.Unlock()
}

// EndLingers ends the lingering closes now and refuses new ones (the
// server shuts down: the clients' answers are theirs to have read).
func (w *Watchdog) EndLingers() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ending = true
	now := time.Now()
	for c := range w.lingering {
		_ = c.Conn.SetReadDeadline(now)
	}
}

// Drain half-closes conn and reads what the client still sends, up to
// limit bytes or deadline, so that the close that follows does not reset
// the connection before the client read its answer. A connection that
// cannot be half-closed is not drained. It is the one drain of the
// public port: the lingering close here and the splitter's refusals.
func Drain(conn net.Conn, deadline time.Time, limit int64) {
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	if conn.SetReadDeadline(deadline) != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, conn, limit)
}
