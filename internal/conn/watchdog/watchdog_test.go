package watchdog

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestWatchdogLate: each limit fires once its time has passed, not before,
// and only for the wait it is about.
func TestWatchdogLate(t *testing.T) {
	const ms = int64(time.Millisecond)
	w := &Watchdog{read: 300 * time.Millisecond, idle: time.Second, write: 500 * time.Millisecond}
	for _, tc := range []struct {
		name                       string
		reading, reqStart, writing int64 // ms since 0; 0: not now
		now                        int64 // ms
		want                       int
	}{
		{name: "nothing pending", now: 10_000, want: reasonNone},
		{name: "idle, within the limit", reading: 1, now: 1 + 1000, want: reasonNone},
		{name: "idle, past the limit", reading: 1, now: 1 + 1001, want: reasonIdle},
		{name: "head started, within the read limit", reading: 1, reqStart: 1, now: 1 + 300, want: reasonNone},
		{name: "head started, past the read limit", reading: 1, reqStart: 1, now: 1 + 301, want: reasonRead},
		{name: "a long keep-alive wait is not a slow head", reading: 5000, reqStart: 0, now: 5000 + 999, want: reasonNone},
		{name: "a slow head is read, not idle", reading: 100, reqStart: 1, now: 1 + 301, want: reasonRead},
		{name: "write, within the limit", writing: 1, now: 1 + 500, want: reasonNone},
		{name: "write, past the limit", writing: 1, now: 1 + 501, want: reasonWrite},
		{name: "a handler's run time is not limited", reqStart: 1, now: 1 + 60_000, want: reasonNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Conn
			c.reading.Store(tc.reading * ms)
			c.reqStart.Store(tc.reqStart * ms)
			c.writing.Store(tc.writing * ms)
			if got := c.late(tc.now*ms, w); got != tc.want {
				t.Errorf("late = %q, want %q", reasonNames[got], reasonNames[tc.want])
			}
		})
	}
}

func TestWatchdogForgetsClosedAndReleased(t *testing.T) {
	w := New(Config{Read: time.Hour, Idle: time.Hour, Write: time.Hour}, nil)
	defer w.Stop()
	a1, b1 := net.Pipe()
	a2, b2 := net.Pipe()
	defer b1.Close()
	defer b2.Close()
	c1, c2 := w.Watch(a1), w.Watch(a2)
	if n := w.len(); n != 2 {
		t.Fatalf("watching %d, want 2", n)
	}
	_ = c1.Close()
	_ = c1.Close()
	c2.Release()
	if n := w.len(); n != 0 {
		t.Errorf("watching %d after close and release, want 0", n)
	}
	go func() { _, _ = b2.Write([]byte("x")) }()
	if _, err := c2.Read(make([]byte, 1)); err != nil {
		t.Errorf("released connection: %v, want it still open", err)
	}
	_ = c2.Close()
}

// TestWatchdogClosesLateAndCounts: a connection past its idle limit is
// closed by the watchdog's goroutine, and counted under its reason.
func TestWatchdogClosesLateAndCounts(t *testing.T) {
	closed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "closed_total"}, []string{"reason"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(closed)
	w := New(Config{Read: time.Hour, Idle: 50 * time.Millisecond, Write: time.Hour}, closed)
	defer w.Stop()
	a, b := net.Pipe()
	defer b.Close()
	c := w.Watch(a)
	// The peer sends nothing: the Read waits until the watchdog closes c.
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("Read = %v, want %v (closed by the watchdog)", err, io.ErrClosedPipe)
	}
	for _, reason := range []string{"idle", "read", "write"} {
		want := 0.0
		if reason == "idle" {
			want = 1
		}
		if got := counted(t, reg, reason); got != want {
			t.Errorf("closed{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	if n := w.len(); n != 0 {
		t.Errorf("watching %d after the close, want 0", n)
	}
}

// TestLingerRefused: a lingering close starts while fewer than
// maxLingering linger, and none once the server shuts down (EndLingers).
func TestLingerRefused(t *testing.T) {
	w := New(Config{Read: time.Hour, Idle: time.Hour, Write: time.Hour}, nil)
	defer w.Stop()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := w.Watch(a)
	if !w.startLinger(c) {
		t.Fatal("startLinger = false with nothing lingering, want true")
	}
	w.endLinger(c)
	for range maxLingering {
		if !w.startLinger(&Conn{Conn: a, w: w}) {
			t.Fatal("startLinger = false below maxLingering, want true")
		}
	}
	if w.startLinger(c) {
		t.Error("startLinger = true with maxLingering lingering, want false")
	}
	w.lingering = make(map[*Conn]struct{})
	w.EndLingers()
	if w.startLinger(c) {
		t.Error("startLinger = true after EndLingers, want false")
	}
}

// counted reads closed_total{reason} from reg.
func counted(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
