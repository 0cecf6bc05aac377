// Package idlepoll tells when idle connections become readable, from one
// goroutine and one epoll set (Linux), so that a connection that waits
// for its peer keeps no goroutine of its own. A goroutine blocked in a
// read keeps its stack for as long as it waits: 4 KiB a connection when
// the read goes through a WebSocket library's frame reader, about 40% of
// what a waiting shopper's socket costs a gateway.
//
// The owner reads what has arrived (Take) until nothing is left, then
// arms the connection again. The descriptor
// stays in Go's own poller as well, which is harmless: nobody waits
// there.
//
// The package knows nothing of the module (layout_test.go).
package idlepoll

import (
	"errors"
	"sync"
	"syscall"
)

var (
	// ErrClosed is returned by Arm once the handle or the poller is closed.
	ErrClosed = errors.New("idlepoll: closed")
	// ErrNothing is Take's answer when no byte has arrived.
	ErrNothing = errors.New("idlepoll: nothing has arrived")
)

// Handle is one connection's place in a Poller.
type Handle struct {
	p  *Poller
	rc syscall.RawConn
	id uint64

	// Guarded by p.mu.
	ready   func() // set while armed
	added   bool   // in the epoll set
	pending bool   // bytes came while it was not armed
	closed  bool
}

// Register adds the connection behind rc to the set and returns its
// handle, not armed yet: bytes that come before the first Arm make it run
// ready at once. The system call runs outside the poller's lock, so that
// a crowd's joins do not queue on it.
func (p *Poller) Register(rc syscall.RawConn) (*Handle, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	p.next++
	h := &Handle{p: p, rc: rc, id: p.next}
	p.handles[h.id] = h // before the set can tell of it
	p.mu.Unlock()
	var err error
	if cerr := rc.Control(func(fd uintptr) { err = p.add(int(fd), h.id) }); cerr != nil {
		err = cerr
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		delete(p.handles, h.id)
		return nil, err
	}
	h.added = true
	return h, nil
}

// Arm calls ready once when the connection has bytes to read, has hung
// up or has failed: on the poller's goroutine, or on the caller's before
// Arm returns when bytes came since the last call (the set tells of new
// bytes once, edge-triggered, so that arming costs no system call). The
// caller reads until Take finds nothing before it arms again; ready must
// not block. Arm fails with ErrClosed once Close or the poller's Close
// ran; then ready will not be called.
func (h *Handle) Arm(ready func()) error {
	p := h.p
	p.mu.Lock()
	if h.closed || p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	if h.ready != nil {
		p.mu.Unlock()
		return errors.New("idlepoll: armed twice")
	}
	if h.pending {
		h.pending = false
		p.mu.Unlock()
		ready()
		return nil
	}
	h.ready = ready
	p.armed++
	p.mu.Unlock()
	return nil
}

// Close takes the connection out of the poller; call it before the
// descriptor closes. It reports whether the handle was armed: then ready
// will never be called, and what it would have done is the caller's.
func (h *Handle) Close() bool {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	h.closed = true
	armed := h.ready != nil
	if armed {
		h.ready = nil
		p.armed--
	}
	delete(p.handles, h.id)
	if h.added && !p.closed {
		// A closed descriptor has left the set with its close already.
		_ = h.rc.Control(func(fd uintptr) { p.del(int(fd)) })
	}
	return armed
}

// take returns the ready function of the handle id, disarmed, or nil;
// a handle that is not armed keeps the news for its next Arm.
func (p *Poller) take(id uint64) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.handles[id]
	if h == nil {
		return nil
	}
	f := h.ready
	if f == nil {
		h.pending = true
		return nil
	}
	h.ready = nil
	p.armed--
	return f
}

// Armed is how many handles wait for their connection.
func (p *Poller) Armed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.armed
}

// pollerState is what every platform's Poller holds.
type pollerState struct {
	mu      sync.Mutex
	next    uint64
	handles map[uint64]*Handle // in the set
	armed   int
	closed  bool
}
