// Package idlepoll tells when idle connections become readable, from one
// goroutine and one epoll set (Linux), so that a connection that waits
// for its peer keeps no goroutine of its own. A goroutine blocked in a
// read keeps its stack for as long as it waits: 4 KiB a connection when
// the read goes through a WebSocket library's frame reader, most of what
// a waiting shopper's socket costs a gateway.
//
// The owner reads only what has arrived (a peek says how much) and arms
// the connection again; the descriptor stays in Go's own poller as well,
// which is harmless: nobody waits there.
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
	// ErrNothing is Peek's answer when no byte has arrived.
	ErrNothing = errors.New("idlepoll: nothing has arrived")
)

// Handle is one connection's place in a Poller.
type Handle struct {
	p  *Poller
	rc syscall.RawConn
	id uint64

	// Guarded by p.mu.
	ready  func() // set while armed
	added  bool   // in the epoll set (armed once or more)
	closed bool
}

// Register returns the handle of the connection behind rc; it is not
// armed yet.
func (p *Poller) Register(rc syscall.RawConn) *Handle {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	return &Handle{p: p, rc: rc, id: p.next}
}

// Arm calls ready once, on the poller's goroutine, when the connection
// has bytes to read, has hung up or has failed; ready must not block.
// It fails with ErrClosed once Close or the poller's Close ran, or with
// the error of a descriptor that is already closed; then ready will not
// be called.
func (h *Handle) Arm(ready func()) error {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.closed || p.closed {
		return ErrClosed
	}
	if h.ready != nil {
		return errors.New("idlepoll: armed twice")
	}
	var err error
	if cerr := h.rc.Control(func(fd uintptr) { err = p.ctl(int(fd), h.id, h.added) }); cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	h.added = true
	h.ready = ready
	p.armed[h.id] = h
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
	h.ready = nil
	delete(p.armed, h.id)
	if h.added && !p.closed {
		// A closed descriptor has left the set with its close already.
		_ = h.rc.Control(func(fd uintptr) { p.del(int(fd)) })
	}
	return armed
}

// take returns the ready function of the handle id, disarmed, or nil.
func (p *Poller) take(id uint64) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.armed[id]
	if h == nil {
		return nil
	}
	delete(p.armed, id)
	f := h.ready
	h.ready = nil
	return f
}

// Armed is how many handles wait for their connection.
func (p *Poller) Armed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.armed)
}

// pollerState is what every platform's Poller holds.
type pollerState struct {
	mu     sync.Mutex
	next   uint64
	armed  map[uint64]*Handle
	closed bool
}
