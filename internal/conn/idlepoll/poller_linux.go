//go:build linux

package idlepoll

import (
	"errors"
	"os"
	"sync"
	"syscall"
)

// Poller is one epoll set and the goroutine that reads it. The set's own
// descriptor waits in Go's poller like a socket, so the goroutine parks
// as a blocked read does (a goroutine blocked in epoll_wait would hold a
// thread, and each wake would cost a trip through the scheduler). Its
// owner calls Close once no connection needs it.
type Poller struct {
	pollerState
	epfd int
	file *os.File // epfd, registered with Go's poller
	done chan struct{}
	once sync.Once
}

// New starts a poller.
func New() (*Poller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := syscall.SetNonblock(epfd, true); err != nil {
		_ = syscall.Close(epfd)
		return nil, err
	}
	f := os.NewFile(uintptr(epfd), "idlepoll")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	p := &Poller{pollerState: pollerState{handles: map[uint64]*Handle{}}, epfd: epfd, file: f, done: make(chan struct{})}
	go p.loop(rc)
	return p, nil
}

// Close ends the poller's goroutine and waits for it. Handles still armed
// are never called: their connections are their owners' to close.
func (p *Poller) Close() {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.handles = map[uint64]*Handle{}
		p.armed = 0
		p.mu.Unlock()
		_ = p.file.Close() // wakes the loop's read, which then fails
		<-p.done
	})
}

// interest is readability, edge-triggered: the set tells of bytes once,
// when they come, so a connection stays in it from Register to Close
// with no system call in between. RDHUP and the always-reported HUP
// and ERR wake a connection whose peer left.
const interest = syscall.EPOLLIN | syscall.EPOLLRDHUP | -syscall.EPOLLET

func (p *Poller) add(fd int, id uint64) error {
	ev := syscall.EpollEvent{Events: interest}
	setID(&ev, id)
	return syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, fd, &ev)
}

func (p *Poller) del(fd int) {
	_ = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, fd, nil)
}

// loop reads the set's events whenever its descriptor is readable, until
// Close. Go's poller watches that descriptor edge-triggered, so each
// wake drains the set before it waits again.
func (p *Poller) loop(rc syscall.RawConn) {
	defer close(p.done)
	events := make([]syscall.EpollEvent, 128)
	_ = rc.Read(func(fd uintptr) bool {
		for {
			n, err := syscall.EpollWait(int(fd), events, 0)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return true // the set is gone: nothing more can be told
			}
			for _, ev := range events[:n] {
				if f := p.take(getID(&ev)); f != nil {
					f()
				}
			}
			if n < len(events) {
				return false // drained: wait for the descriptor
			}
		}
	})
}

// An event carries its handle's id in the two 32-bit words after Events.
func setID(ev *syscall.EpollEvent, id uint64) {
	ev.Fd = int32(uint32(id))
	ev.Pad = int32(uint32(id >> 32))
}

func getID(ev *syscall.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// Take reads the bytes that have arrived on rc into buf, without waiting:
// ErrNothing when none have, 0 bytes when the peer has closed its side.
func Take(rc syscall.RawConn, buf []byte) (int, error) {
	var n int
	var err error
	if cerr := rc.Control(func(fd uintptr) {
		n, _, err = syscall.Recvfrom(int(fd), buf, syscall.MSG_DONTWAIT)
	}); cerr != nil {
		return 0, cerr
	}
	if errors.Is(err, syscall.EAGAIN) {
		return 0, ErrNothing
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}
