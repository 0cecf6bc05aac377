package idlepoll

import (
	"errors"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func readlink(fd int) (string, error) { return os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)) }

func TestPollerCloseEndsLoop(t *testing.T) {
	p, err := New()
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip("no epoll here")
	}
	if err != nil {
		t.Fatal(err)
	}
	s, _ := testenv.TCPPair(t)
	h := register(t, p, s)
	arm(t, h)
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return: the loop goes on")
	}
	select {
	case <-p.done:
	default:
		t.Fatal("Close returned before the loop ended")
	}
	p.Close() // twice is fine
	if err := h.Arm(func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Arm after the poller's Close: %v, want ErrClosed", err)
	}
	rc, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Register(rc); !errors.Is(err, ErrClosed) {
		t.Fatalf("Register after the poller's Close: %v, want ErrClosed", err)
	}
	h.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(p.epfd, &st); err == nil && st.Ino != 0 {
		// The number may have been reused by pair's sockets; only an
		// epoll descriptor left open would be ours.
		if target, _ := readlink(p.epfd); target == "anon_inode:[eventpoll]" {
			t.Fatal("the epoll descriptor is still open")
		}
	}
}
