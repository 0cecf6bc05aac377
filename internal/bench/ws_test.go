package bench

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestWSBaseline: the bare server answers a join with its status, keeps
// the socket until the client closes it, and returns once its context
// ends, with every handler done.
func TestWSBaseline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serveWSBaseline(ctx, ln) }()

	target := wsTarget{url: "ws://" + ln.Addr().String() + "/api/flash-sales/sales/1/queue"}
	c, state, err := wsJoin(ctx, http.DefaultClient, target, 1)
	if err != nil {
		t.Fatal(err)
	}
	if state != "PREQUEUE" {
		t.Fatalf("first message's state %q, want PREQUEUE", state)
	}
	// A second one stays open while the server stops.
	c2, _, err := wsJoin(ctx, http.DefaultClient, target, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.CloseNow()
	if err := c.Close(1000, ""); err != nil {
		t.Fatalf("close handshake: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serveWSBaseline: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serveWSBaseline did not return after its context ended")
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if _, _, err := c2.Read(rctx); err == nil || rctx.Err() != nil {
		t.Fatalf("a connection outlived the baseline server: read %v", err)
	}
}

// TestWSSummary: medians a server, the gateway's ratios to the baseline,
// per-socket-second hold and the Redis columns.
func TestWSSummary(t *testing.T) {
	mk := func(server string, join, hold, cl, rjoin time.Duration) WSSample {
		return WSSample{Server: server, Joined: 1000, Held: 10 * time.Second, JoinCPU: join, HoldCPU: hold, CloseCPU: cl, RedisJoin: rjoin}
	}
	samples := []WSSample{
		mk(WSBaseline, 100*time.Millisecond, 10*time.Millisecond, 30*time.Millisecond, 0),
		mk(WSGateway, 300*time.Millisecond, 20*time.Millisecond, 60*time.Millisecond, 40*time.Millisecond),
		mk(WSBaseline, 200*time.Millisecond, 30*time.Millisecond, 50*time.Millisecond, 0),
		mk(WSGateway, 500*time.Millisecond, 40*time.Millisecond, 90*time.Millisecond, 40*time.Millisecond),
		mk(WSBaseline, 150*time.Millisecond, 20*time.Millisecond, 40*time.Millisecond, 0),
		mk(WSGateway, 400*time.Millisecond, 30*time.Millisecond, 120*time.Millisecond, 40*time.Millisecond),
	}
	got := WSSummary(samples, WSOptions{})
	for _, want := range []string{
		"ws-bare  100.0 200.0 150.0",
		"150.0 1.00 3.00 2.00",
		"gateway  300.0 500.0 400.0",
		"400.0 2.00 4.00 3.00",
		"40.0, 0.00",
		"gateway ÷ baseline: join 2.67×, waiting 1.50×, close 2.25×",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
}

// TestRunWSAgainstBaseline: a small run against the baseline, served in
// this process, joins every shopper, holds them for the hold and takes
// their closes.
func TestRunWSAgainstBaseline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveWSBaseline(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serveWSBaseline: %v", err)
		}
	}()

	o := WSOptions{Conns: 60, Rate: 600, Hold: 300 * time.Millisecond, Sources: 3}.withDefaults()
	s, err := runWS(ctx, o, wsTarget{url: "ws://" + ln.Addr().String() + "/api/flash-sales/sales/1/queue", pid: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if s.Joined != 60 || s.Failed != 0 || s.States["PREQUEUE"] != 60 {
		t.Fatalf("joined %d, failed %d, first states %v; want 60 PREQUEUE", s.Joined, s.Failed, s.States)
	}
	if s.Joins < 90*time.Millisecond || s.Held < o.Hold {
		t.Fatalf("joins took %v (paced at 600/s: at least 98 ms), held %v (want at least %v)", s.Joins, s.Held, o.Hold)
	}
}
