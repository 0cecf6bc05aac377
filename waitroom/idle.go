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
// room's poller (idlepoll) says when bytes arrive, a peek says how many
// of them make whole messages, and coder/websocket reads exactly those
// (idleConn's budget) from a goroutine of r.work, then the connection is
// armed again. A reader goroutine blocked in the library's frame reader
// keeps a 4 KiB stack for the connection's life: 40% of a waiting
// socket's memory. What arrives between two messages is mostly the pong
// of the room's own ping.
//
// A connection the poller cannot watch (no socket of its own under it,
// bytes buffered above the socket, no epoll here), and one whose peer
// has sent part of a message, is read by a goroutine of its own (watch),
// as every connection was before.

// idleConn is the socket under a hijacked WebSocket.
type idleConn struct {
	net.Conn
	pre []byte // bytes the client sent before the hijack: read first
	// budget is how many more bytes a read may take: the whole messages
	// the last peek found. Below zero reads block as on any connection.
	budget atomic.Int64

	mu  sync.Mutex
	h   *idlepoll.Handle // set while the poller watches the connection
	end func()           // the connection's end, when Close finds it armed
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
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		if len(c.pre) == 0 {
			c.pre = nil
		}
		return n, nil
	}
	b := c.budget.Load()
	if b < 0 {
		return c.Conn.Read(p)
	}
	if b == 0 {
		return 0, errIdle
	}
	if int64(len(p)) > b {
		p = p[:b]
	}
	n, err := c.Conn.Read(p)
	c.budget.Add(-int64(n))
	return n, err
}

// Close takes the connection out of the poller first. An armed one has
// nobody reading it, so its end runs here (on another goroutine: Close is
// called from inside the library's close).
func (c *idleConn) Close() error {
	c.mu.Lock()
	h, end := c.h, c.end
	c.h = nil
	c.mu.Unlock()
	if h != nil && h.Close() {
		end()
	}
	return c.Conn.Close()
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
	if rc != nil && p != nil {
		c.closeMu.Lock()
		if br.Buffered() == 0 {
			// From here a close handshake reads nothing: it would
			// block with no reader waiting for the peer.
			ic.budget.Store(0)
		} else {
			rc = nil // a message the peek cannot see
		}
		c.closeMu.Unlock()
	}
	if rc == nil || p == nil {
		go func() {
			c.watch(sr, &chooseLimit{})
			end()
		}()
		return
	}
	w := &idleWait{c: c, sr: sr, rc: rc, end: end}
	ic.mu.Lock()
	ic.h = p.Register(rc)
	ic.end = func() { c.r.work.Go(end) }
	ic.mu.Unlock()
	w.arm()
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
// cannot be armed: its end is then this goroutine's.
func (w *idleWait) arm() {
	ic := w.c.ic
	ic.mu.Lock()
	h := ic.h
	ic.mu.Unlock()
	if h == nil || h.Arm(w.ready) != nil {
		w.end()
	}
}

func (w *idleWait) ready() { w.c.r.work.Go(w.read) }

// peekBufs holds the peek's buffers: a choose, a pong or a close is far
// shorter; a longer message goes to watch.
var peekBufs = sync.Pool{New: func() any { return new([1024]byte) }}

// read takes the whole messages that have arrived, then arms again (bytes
// that came meanwhile wake the poller at once). A part of a message, the
// peer's end or a socket error goes to watch, whose blocking read sees it
// as every connection did before.
func (w *idleWait) read() {
	c := w.c
	buf := peekBufs.Get().(*[1024]byte)
	k, err := idlepoll.Peek(w.rc, buf[:])
	n := wholeMessages(buf[:k])
	peekBufs.Put(buf)
	switch {
	case errors.Is(err, idlepoll.ErrNothing):
		w.arm()
		return
	case err != nil || n == 0:
		w.block()
		return
	}
	c.ic.budget.Store(int64(n))
	for {
		b, err := c.readMessage(context.Background())
		if errors.Is(err, errIdle) {
			break
		}
		if !c.handle(w.sr, &w.lim, b, err) {
			w.detach()
			w.end()
			return
		}
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
	ic := w.c.ic
	ic.mu.Lock()
	h := ic.h
	ic.h = nil
	ic.mu.Unlock()
	if h != nil {
		h.Close()
	}
}

// wholeMessages returns the length of b's longest prefix that ends at a
// message boundary: whole client frames (RFC 6455 5.2), with no data
// message left open by a frame without FIN. A frame the library will
// refuse (a reserved opcode, no mask) is counted whole all the same: the
// library's read refuses it.
func wholeMessages(b []byte) int {
	at, boundary, open := 0, 0, false
	for len(b)-at >= 2 {
		b0, b1 := b[at], b[at+1]
		h := 2
		size := uint64(b1 & 0x7f)
		switch size {
		case 126:
			if len(b)-at < 4 {
				return boundary
			}
			size = uint64(b[at+2])<<8 | uint64(b[at+3])
			h = 4
		case 127:
			if len(b)-at < 10 {
				return boundary
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
			return boundary
		}
		at += h + int(size)
		if b0&0x08 == 0 { // a data frame: text, binary, continuation
			open = b0&0x80 == 0
		}
		if !open {
			boundary = at
		}
	}
	return boundary
}
