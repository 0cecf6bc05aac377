package idlepoll

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func newPoller(t *testing.T) *Poller {
	t.Helper()
	p, err := New()
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip("no epoll here")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func register(t *testing.T, p *Poller, c *net.TCPConn) *Handle {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	h, err := p.Register(rc)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// arm arms h and returns a channel that gets a value each time ready runs.
func arm(t *testing.T, h *Handle) chan struct{} {
	t.Helper()
	ch := make(chan struct{}, 4)
	if err := h.Arm(func() { ch <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	return ch
}

func fired(ch chan struct{}, within time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(within):
		return false
	}
}

func TestReadyOnceWhenBytesArrive(t *testing.T) {
	p := newPoller(t)
	s, c := testenv.TCPPair(t)
	h := register(t, p, s)
	ch := arm(t, h)
	if fired(ch, 50*time.Millisecond) {
		t.Fatal("ready ran with nothing to read")
	}
	if _, err := c.Write([]byte("ab")); err != nil {
		t.Fatal(err)
	}
	if !fired(ch, 5*time.Second) {
		t.Fatal("ready did not run when bytes arrived")
	}
	// Once: more bytes do not call it again until it is armed again,
	// and then it runs at once, before Arm returns.
	if _, err := c.Write([]byte("c")); err != nil {
		t.Fatal(err)
	}
	if fired(ch, 50*time.Millisecond) {
		t.Fatal("ready ran twice for one Arm")
	}
	if p.Armed() != 0 {
		t.Fatalf("armed %d after the wake, want 0", p.Armed())
	}
	ran := false
	if err := h.Arm(func() { ran = true }); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("ready did not run at once for bytes that came while unarmed")
	}
	// Everything read: armed again, it waits for new bytes.
	buf := make([]byte, 8)
	if n, err := s.Read(buf); err != nil || n != 3 {
		t.Fatalf("read %d, %v; want 3 bytes", n, err)
	}
	ch = arm(t, h)
	if fired(ch, 50*time.Millisecond) {
		t.Fatal("ready ran after everything was read")
	}
	if _, err := c.Write([]byte("d")); err != nil {
		t.Fatal(err)
	}
	if !fired(ch, 5*time.Second) {
		t.Fatal("ready did not run for new bytes")
	}
}

func TestReadyWhenPeerLeaves(t *testing.T) {
	p := newPoller(t)
	s, c := testenv.TCPPair(t)
	ch := arm(t, register(t, p, s))
	c.Close()
	if !fired(ch, 5*time.Second) {
		t.Fatal("ready did not run when the peer closed")
	}
}

func TestCloseArmed(t *testing.T) {
	p := newPoller(t)
	s, c := testenv.TCPPair(t)
	h := register(t, p, s)
	ch := arm(t, h)
	if !h.Close() {
		t.Fatal("Close of an armed handle reported it unarmed")
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if fired(ch, 100*time.Millisecond) {
		t.Fatal("ready ran after Close")
	}
	if h.Close() {
		t.Fatal("a second Close reported the handle armed")
	}
	if err := h.Arm(func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Arm after Close: %v, want ErrClosed", err)
	}
}

func TestCloseAfterShot(t *testing.T) {
	p := newPoller(t)
	s, c := testenv.TCPPair(t)
	h := register(t, p, s)
	ch := arm(t, h)
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if !fired(ch, 5*time.Second) {
		t.Fatal("ready did not run")
	}
	if h.Close() {
		t.Fatal("Close after the shot reported the handle armed: its owner would finish it twice")
	}
}

// A descriptor closed while armed leaves the set; a new connection that
// gets the same number is armed afresh and told of its own bytes.
func TestClosedDescriptorReused(t *testing.T) {
	p := newPoller(t)
	s, _ := testenv.TCPPair(t)
	h := register(t, p, s)
	arm(t, h)
	h.Close()
	s.Close()
	s2, c2 := testenv.TCPPair(t)
	ch := arm(t, register(t, p, s2))
	if _, err := c2.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if !fired(ch, 5*time.Second) {
		t.Fatal("ready did not run for the new connection")
	}
}

func TestRegisterClosedDescriptor(t *testing.T) {
	p := newPoller(t)
	s, _ := testenv.TCPPair(t)
	rc, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := p.Register(rc); err == nil {
		t.Fatal("Register of a closed descriptor succeeded")
	}
}

// TestBytesBeforeArm: bytes that come between Register and the first Arm
// are not lost: ready runs for them.
func TestBytesBeforeArm(t *testing.T) {
	p := newPoller(t)
	s, c := testenv.TCPPair(t)
	h := register(t, p, s)
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if !fired(arm(t, h), 5*time.Second) {
		t.Fatal("ready did not run for bytes that came before the first Arm")
	}
}

func TestTake(t *testing.T) {
	s, c := testenv.TCPPair(t)
	rc, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := Take(rc, buf); !errors.Is(err, ErrNothing) {
		t.Fatalf("Take with nothing sent: %v, want ErrNothing", err)
	}
	if _, err := c.Write([]byte("abcdef")); err != nil {
		t.Fatal(err)
	}
	p := newPoller(t)
	h := register(t, p, s)
	if !fired(arm(t, h), 5*time.Second) {
		t.Fatal("bytes did not arrive")
	}
	var got []byte
	for len(got) < 6 {
		n, err := Take(rc, buf)
		if err != nil {
			t.Fatalf("Take: %v after %q", err, got)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "abcdef" {
		t.Fatalf("took %q, want abcdef", got)
	}
	if _, err := Take(rc, buf); !errors.Is(err, ErrNothing) {
		t.Fatalf("Take after everything was taken: %v, want ErrNothing", err)
	}
	c.Close()
	if !fired(arm(t, h), 5*time.Second) {
		t.Fatal("the close did not arrive")
	}
	if n, err := Take(rc, buf); n != 0 || err != nil {
		t.Fatalf("Take after the peer closed: %d, %v; want 0, nil", n, err)
	}
}
