package waitroom

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/flashsale/flashsale/internal/conn/idlepoll"
)

// A joined connection waits for its shopper without a goroutine: the
// room's poller (idlepoll) says when bytes arrive, ready takes them off
// the socket, and coder/websocket reads the whole messages at their head
// (idleConn's budget), then the connection is armed again. A reader
// goroutine blocked in the library's frame reader keeps a 4 KiB stack for
// the connection's life: 40% of a waiting socket's memory. What arrives
// between two messages is mostly the pong of the room's own ping.
//
// A connection the poller cannot watch (no socket of its own under it,
// bytes buffered above the socket, no epoll here), and one whose peer
// has sent part of a message or more than a wake reads, is read by a
// goroutine of its own (watch), as every connection was before.

// idleConn is the socket under a hijacked WebSocket.
type idleConn struct {
	net.Conn
	// pre is read before the socket: bytes the client sent before the
	// hijack, then what the poller's wake took off the socket.
	pre []byte
	// budget is how many more bytes a read may take: the whole messages
	// at the head of pre. Below zero reads block as on any connection.
	budget atomic.Int64

	mu     sync.Mutex
	h      *idlepoll.Handle // set while the poller watches the connection
	end    func()           // the connection's end, when Close finds it armed
	closed bool
}

// errIdle ends the library's read once the budget is spent: it comes at
// a message's boundary, so nothing is half read.
var errIdle = errors.New("waitroom: the arrived messages are read")

func newIdleConn(nc net.Conn) *idleConn {
	c := &idleConn{Conn: nc}
	c.budget.Store(-1)
	return c
}

func (c *idleConn) Read(p []byte) (int, error) {
	b := c.budget.Load()
	if b == 0 {
		return 0, errIdle
	}
	if b > 0 && int64(len(p)) > b {
		p = p[:b]
	}
	var n int
	var err error
	if len(c.pre) > 0 {
		n = copy(p, c.pre)
		c.pre = c.pre[n:]
		if len(c.pre) == 0 {
			c.pre = nil
		}
	} else {
		n, err = c.Conn.Read(p)
	}
	if b > 0 {
		c.budget.Add(-int64(n))
	}
	return n, err
}

// Close takes the connection out of the poller first. An armed one has
// nobody reading it, so its end runs here (on another goroutine: Close is
// called from inside the library's close).
func (c *idleConn) Close() error {
	if h, end := c.release(true); h != nil && h.Close() {
		end()
	}
	return c.Conn.Close()
}

// release takes the poller's handle (nil when it is gone already) and the
// connection's end; closing marks the connection closed.
func (c *idleConn) release(closing bool) (*idlepoll.Handle, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.h
	c.h = nil
	c.closed = c.closed || closing
	return h, c.end
}

// rawConn is the socket's, or nil when something above it may hold
// bytes a peek of the socket cannot see.
func (c *idleConn) rawConn() syscall.RawConn {
	if len(c.pre) > 0 {
		return nil
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// poller returns the room's poller, started at the first joined
// connection; nil where there is none (not Linux, or it failed once).
func (r *Room) poller() *idlepoll.Poller {
	r.idleMu.Lock()
	defer r.idleMu.Unlock()
	if r.idle == nil && !r.idleTried {
		r.idleTried = true
		p, err := idlepoll.New()
		if err != nil {
			if !errors.Is(err, errors.ErrUnsupported) {
				r.log.Warn("no poller: each connection keeps a reader goroutine", "err", err)
			}
			return nil
		}
		r.idle = p
	}
	return r.idle
}

// closePoller stops the poller; called once no connection is left.
func (r *Room) closePoller() {
	r.idleMu.Lock()
	p := r.idle
	r.idle = nil
	r.idleMu.Unlock()
	if p != nil {
		p.Close()
	}
}

// wait hands the joined connection to the poller, or to a goroutine of
// its own; end runs once, when the connection is done.
func (c *conn) wait(sr *saleRoom, end func()) {
	ic, br := c.ic, c.br
	var rc syscall.RawConn
	var p *idlepoll.Poller
	if ic != nil && br != nil {
		rc = ic.rawConn()
		p = c.r.poller()
	}
	var h *idlepoll.Handle
	if rc != nil && p != nil {
		c.closeMu.Lock()
		if br.Buffered() == 0 {
			if h, _ = p.Register(rc); h != nil {
				// From here a read takes only what a wake found
				// (leaveIdle undoes it for a close handshake).
				ic.budget.Store(0)
			}
		}
		c.closeMu.Unlock()
	}
	if h == nil {
		go func() {
			c.watch(sr, &chooseLimit{})
			end()
		}()
		return
	}
	w := &idleWait{c: c, sr: sr, rc: rc, end: end}
	ic.mu.Lock()
	if ic.closed {
		ic.mu.Unlock()
		h.Close()
		c.r.work.Go(end)
		return
	}
	ic.h = h
	ic.end = func() { c.r.work.Go(end) }
	ic.mu.Unlock()
	w.arm()
}

// leaveIdle readies a connection for a close handshake: a connection the
// poller holds armed leaves it, and its reads block again, so that the
// library reads the peer's close frame (a byte left unread when the
// socket closes turns its FIN into a reset, which can take our close
// frame with it). It returns the connection's end when the poller held
// it: the caller runs it after the close. Called under closeMu.
func (c *conn) leaveIdle() (end func()) {
	ic := c.ic
	if ic == nil {
		return nil
	}
	h, end := ic.release(false)
	if h == nil || !h.Close() {
		return nil // not armed: whoever reads it now ends it
	}
	ic.budget.Store(-1)
	return end
}

// idleWait is a joined connection the poller watches.
type idleWait struct {
	c   *conn
	sr  *saleRoom
	rc  syscall.RawConn
	lim chooseLimit
	end func()
}

// arm asks the poller for the next bytes. A connection closed meanwhile
// cannot be armed: its end is then the caller's, run on r.work.
func (w *idleWait) arm() {
	ic := w.c.ic
	ic.mu.Lock()
	h := ic.h
	ic.mu.Unlock()
	if h == nil || h.Arm(w.ready) != nil {
		w.c.r.work.Go(w.end) // never on the poller's goroutine: it may wait on Redis
	}
}

// takeBufs holds the buffers a wake reads into: a choose, a pong or a
// close is far shorter; a longer message goes to watch.
var takeBufs = sync.Pool{New: func() any { return new([1024]byte) }}

// ready takes what has arrived off the socket (on the poller's goroutine,
// or on the one that armed the connection). Pongs alone, most of what a
// waiting connection receives, are read here: the library hands a pong to
// the waiting ping and blocks on nothing. Anything else is read by a
// goroutine of r.work (a choose runs a Redis script, a close writes).
// Part of a message, the peer's end or a socket error goes to watch,
// whose blocking read sees it (after the part already taken) as every
// connection did before.
func (w *idleWait) ready() {
	ic := w.c.ic
	buf := takeBufs.Get().(*[1024]byte)
	k, err := idlepoll.Take(w.rc, buf[:])
	if k > 0 {
		ic.pre = append(ic.pre, buf[:k]...)
	}
	takeBufs.Put(buf)
	if errors.Is(err, idlepoll.ErrNothing) {
		w.arm()
		return
	}
	n, pongs := wholeMessages(ic.pre)
	switch {
	case err != nil || k == 0 || k == len(buf) || n == 0:
		// A full buffer may have left bytes behind, of which the poller
		// would not tell again.
		w.block()
	case pongs && n == len(ic.pre):
		w.read(n)
	default:
		w.c.r.work.Go(func() { w.read(n) })
	}
}

// read lets the library read the n bytes of whole messages at the head
// of ic.pre, then arms the connection again (bytes that came meanwhile
// run ready again at once).
func (w *idleWait) read(n int) {
	c := w.c
	ic := c.ic
	ic.budget.Store(int64(n))
	for {
		b, err := c.readMessage(context.Background())
		if errors.Is(err, errIdle) {
			break
		}
		if !c.handle(w.sr, &w.lim, b, err) {
			w.detach()
			c.r.work.Go(w.end) // it may wait on Redis: never on the poller's goroutine
			return
		}
	}
	if len(ic.pre) > 0 {
		w.block() // the start of a message came after the whole ones
		return
	}
	w.arm()
}

// block leaves the poller for a goroutine that waits in the library's
// reader (on a connection closed meanwhile, its read fails at once).
func (w *idleWait) block() {
	w.detach()
	w.c.ic.budget.Store(-1)
	go func() {
		w.c.watch(w.sr, &w.lim)
		w.end()
	}()
}

// detach takes the connection out of the poller, unless Close did. It
// is not armed (read runs), so its end stays the caller's.
func (w *idleWait) detach() {
	if h, _ := w.c.ic.release(false); h != nil {
		h.Close()
	}
}

// wholeMessages returns the length of b's longest prefix that ends at a
// message boundary: whole client frames (RFC 6455 5.2), with no data
// message left open by a frame without FIN; pongs reports that every
// frame of that prefix is a pong. A frame the library will refuse (a
// reserved opcode, no mask) is counted whole all the same: the library's
// read refuses it.
func wholeMessages(b []byte) (n int, pongs bool) {
	at, open, allPongs := 0, false, true
	pongs = true
	for len(b)-at >= 2 {
		b0, b1 := b[at], b[at+1]
		h := 2
		size := uint64(b1 & 0x7f)
		switch size {
		case 126:
			if len(b)-at < 4 {
				return n, pongs
			}
			size = uint64(b[at+2])<<8 | uint64(b[at+3])
			h = 4
		case 127:
			if len(b)-at < 10 {
				return n, pongs
			}
			size = 0
			for _, x := range b[at+2 : at+10] {
				size = size<<8 | uint64(x)
			}
			h = 10
		}
		if b1&0x80 != 0 {
			h += 4 // the mask key
		}
		if len(b)-at < h || size > uint64(len(b)-at-h) {
			return n, pongs
		}
		at += h + int(size)
		if b0&0x08 == 0 { // a data frame: text, binary, continuation
			open = b0&0x80 == 0
		}
		allPongs = allPongs && b0&0x0f == 0xA
		if !open {
			n, pongs = at, allPongs
		}
	}
	return n, pongs
}
