//go:build linux

package idlepoll

import (
	"errors"
	"sync"
	"syscall"
)

// Poller is one epoll set and the goroutine that waits on it. Its owner
// calls Close once no connection needs it.
type Poller struct {
	pollerState
	epfd int
	wake [2]int // a pipe: a byte in it ends the loop
	done chan struct{}
	once sync.Once
}

// wakeID is the event id of the pipe; handle ids start at 1.
const wakeID = 0

// New starts a poller.
func New() (*Poller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	p := &Poller{pollerState: pollerState{armed: map[uint64]*Handle{}}, epfd: epfd, done: make(chan struct{})}
	if err := syscall.Pipe2(p.wake[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		_ = syscall.Close(epfd)
		return nil, err
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN}
	setID(&ev, wakeID)
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, p.wake[0], &ev); err != nil {
		p.closeFDs()
		return nil, err
	}
	go p.loop()
	return p, nil
}

// Close ends the poller's goroutine and waits for it. Handles still armed
// are never called: their connections are their owners' to close.
func (p *Poller) Close() {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.armed = map[uint64]*Handle{}
		p.mu.Unlock()
		_, _ = syscall.Write(p.wake[1], []byte{1})
		<-p.done
		p.closeFDs()
	})
}

func (p *Poller) closeFDs() {
	_ = syscall.Close(p.epfd)
	_ = syscall.Close(p.wake[0])
	_ = syscall.Close(p.wake[1])
}

// interest is one shot of readability: after it fires, the descriptor
// stays in the set, silent, until Arm modifies it again. RDHUP and the
// always-reported HUP and ERR wake a connection whose peer left.
const interest = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT

func (p *Poller) ctl(fd int, id uint64, added bool) error {
	ev := syscall.EpollEvent{Events: interest}
	setID(&ev, id)
	op := syscall.EPOLL_CTL_ADD
	if added {
		op = syscall.EPOLL_CTL_MOD
	}
	err := syscall.EpollCtl(p.epfd, op, fd, &ev)
	if errors.Is(err, syscall.ENOENT) && added {
		// The descriptor number was closed and reused under us: a new
		// connection, never in the set.
		err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, fd, &ev)
	}
	return err
}

func (p *Poller) del(fd int) {
	_ = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, fd, nil)
}

func (p *Poller) loop() {
	defer close(p.done)
	events := make([]syscall.EpollEvent, 128)
	for {
		n, err := syscall.EpollWait(p.epfd, events, -1)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return // the set is gone: nothing more can be told
		}
		for _, ev := range events[:n] {
			id := getID(&ev)
			if id == wakeID {
				return
			}
			if f := p.take(id); f != nil {
				f()
			}
		}
	}
}

// An event carries its handle's id in the two 32-bit words after Events.
func setID(ev *syscall.EpollEvent, id uint64) {
	ev.Fd = int32(uint32(id))
	ev.Pad = int32(uint32(id >> 32))
}

func getID(ev *syscall.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// Peek copies the bytes that have arrived on rc into buf without taking
// them. It returns ErrNothing when none have, and 0 bytes when the peer
// has closed its side.
func Peek(rc syscall.RawConn, buf []byte) (int, error) {
	var n int
	var err error
	if cerr := rc.Control(func(fd uintptr) {
		n, _, err = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
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
