package waitroom

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// frame encodes one client frame (masked, as a browser sends it).
func frame(fin bool, op byte, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	b := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n < 1<<16:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	b = append(b, 1, 2, 3, 4) // the mask key; the payload stays as it is
	return append(b, payload...)
}

func TestWholeMessages(t *testing.T) {
	text := frame(true, 1, []byte(`{"type":"choose","itemId":7}`))
	pong := frame(true, 0xA, []byte("12"))
	first := frame(false, 1, []byte("ab"))
	cont := frame(true, 0, []byte("cd"))
	long := frame(true, 1, bytes.Repeat([]byte("x"), 300))
	cat := func(fs ...[]byte) []byte { return bytes.Join(fs, nil) }
	tests := []struct {
		name  string
		b     []byte
		want  int
		pongs bool
	}{
		{"nothing", nil, 0, true},
		{"one byte", text[:1], 0, true},
		{"part of the mask key", text[:3], 0, true},
		{"a header only", text[:6], 0, true},
		{"a message", text, len(text), false},
		{"a pong", pong, len(pong), true},
		{"two pongs", cat(pong, pong), 2 * len(pong), true},
		{"a pong and part of a message", cat(pong, text[:9]), len(pong), true},
		{"two messages", cat(text, pong), len(text) + len(pong), false},
		{"a pong, then a message", cat(pong, text), len(pong) + len(text), false},
		{"a close", frame(true, 0x8, nil), 6, false},
		{"16-bit length", long, len(long), false},
		{"16-bit length, cut", long[:len(long)-1], 0, true},
		{"16-bit length, header cut", long[:3], 0, true},
		{"fragments: the first only", first, 0, true},
		{"fragments: a pong between", cat(first, pong), 0, true},
		{"fragments: whole", cat(first, pong, cont), len(first) + len(pong) + len(cont), false},
		{"fragments: whole, then a pong", cat(first, cont, pong), len(first) + len(cont) + len(pong), false},
		{"a pong, then the first fragment", cat(pong, first), len(pong), true},
		{"64-bit length beyond", []byte{0x81, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}, 0, true},
		{"unmasked", []byte{0x81, 0x01, 'x'}, 3, false},
	}
	for _, tt := range tests {
		if got, pongs := wholeMessages(tt.b); got != tt.want || pongs != tt.pongs {
			t.Errorf("%s: %d, %v; want %d, %v", tt.name, got, pongs, tt.want, tt.pongs)
		}
	}
}

// FuzzWholeMessages builds a stream of frames from the input (each step:
// a kind and a length), cuts it anywhere, and checks wholeMessages against
// the boundaries known from building it; any bytes at all must not panic
// or count past their end.
func FuzzWholeMessages(f *testing.F) {
	f.Add([]byte{0, 5, 1, 200, 2, 3}, uint16(7))
	f.Add([]byte{3, 0, 3, 130, 4, 1}, uint16(300))
	f.Fuzz(func(t *testing.T, steps []byte, cut uint16) {
		if n, _ := wholeMessages(steps); n < 0 || n > len(steps) {
			t.Fatalf("arbitrary bytes: %d of %d", n, len(steps))
		}
		var stream []byte
		bounds := []int{0}
		pongsTo := []bool{true} // every frame up to bounds[i] a pong
		open, allPongs := false, true
		for i := 0; i+1 < len(steps) && len(stream) < 1<<17; i += 2 {
			size := int(steps[i+1])
			if steps[i+1] > 250 {
				size = int(steps[i+1]) * 300 // past the 16-bit and 64-bit marks
			}
			payload := bytes.Repeat([]byte{'p'}, size)
			switch steps[i] % 5 {
			case 0: // a whole text message
				if open {
					continue
				}
				stream = append(stream, frame(true, 1, payload)...)
			case 1: // a message's first fragment
				if open {
					continue
				}
				stream = append(stream, frame(false, 2, payload)...)
				open = true
			case 2: // a continuation, the last or not
				if !open {
					continue
				}
				last := steps[i+1]%2 == 0
				stream = append(stream, frame(last, 0, payload)...)
				open = !last
			case 3: // a pong
				stream = append(stream, frame(true, 0xA, payload[:min(size, 125)])...)
			case 4: // a close
				stream = append(stream, frame(true, 0x8, payload[:min(size, 125)])...)
			}
			allPongs = allPongs && steps[i]%5 == 3
			if !open {
				bounds = append(bounds, len(stream))
				pongsTo = append(pongsTo, allPongs)
			}
		}
		at := int(cut) % (len(stream) + 1)
		want, wantPongs := 0, true
		for i, b := range bounds {
			if b <= at {
				want, wantPongs = b, pongsTo[i]
			}
		}
		if got, pongs := wholeMessages(stream[:at]); got != want || pongs != wantPongs {
			t.Fatalf("cut at %d of %d: %d, %v; want %d, %v", at, len(stream), got, pongs, want, wantPongs)
		}
	})
}

// waiters counts the goroutines blocked in a joined connection's reader.
func waiters() int {
	buf := make([]byte, 8<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "waitroom.(*conn).watch(")
}

func armed(r *Room) int {
	r.idleMu.Lock()
	defer r.idleMu.Unlock()
	if r.idle == nil {
		return 0
	}
	return r.idle.Armed()
}

// TestJoinedConnectionsKeepNoGoroutine: a joined connection waits in the
// poller, not in a goroutine of its own, and its leaving still ends it.
func TestJoinedConnectionsKeepNoGoroutine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the poller is Linux's")
	}
	e := newEnv(t)
	sale := e.addSale(newSale(t, 2, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{}, nil)
	const n = 20
	cs := prequeued(t, e, g, sale.ID, n)
	eventually(t, "every connection armed", 10*time.Second, func() bool { return armed(g.room) == n })
	if w := waiters(); w != 0 {
		t.Fatalf("%d joined connections have a reader goroutine, want 0", w)
	}
	for _, c := range cs[:n/2] {
		_ = c.ws.Close(websocket.StatusNormalClosure, "")
	}
	for _, c := range cs[n/2:] {
		_ = c.ws.CloseNow() // no close frame: the socket's end
	}
	eventually(t, "the connections gone", 10*time.Second, func() bool {
		g.room.mu.Lock()
		defer g.room.mu.Unlock()
		return len(g.room.conns) == 0 && armed(g.room) == 0
	})
}

// TestIdleConnectionAnswersPings: the pongs of a connection in the poller
// are read, so the room's pings succeed and the connection stays.
func TestIdleConnectionAnswersPings(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the poller is Linux's")
	}
	e := newEnv(t)
	sale := e.addSale(newSale(t, 2, e.clock.Now().Add(time.Minute), 10, 10))
	// A ping every 1.5 s, answered within 1.5 s: a loaded machine's
	// scheduling does not close a connection here.
	g := e.newGateway(Config{IdleTimeout: 3 * time.Second}, nil)
	const n = 5
	cs := prequeued(t, e, g, sale.ID, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range cs { // a client answers pings while it reads
		go func() {
			for ctx.Err() == nil {
				if _, _, err := c.ws.Read(ctx); err != nil {
					return
				}
			}
		}()
	}
	sent := func() float64 {
		v, _ := g.counterValue(t, "flashsale_waitroom_pings_total", "sent")
		return v
	}
	// Three ping periods: a ping left unanswered closes its connection
	// within one.
	eventually(t, "three pings each", 20*time.Second, func() bool { return sent() >= 3*n })
	g.room.mu.Lock()
	left := len(g.room.conns)
	g.room.mu.Unlock()
	if left != n {
		t.Fatalf("%d connections left after their pings, want %d", left, n)
	}
	if w := waiters(); w != 0 {
		t.Fatalf("%d reader goroutines, want 0", w)
	}
}

// splitConn writes the next Write in two parts, waiting between them.
type splitConn struct {
	net.Conn
	hold    chan struct{} // set: the next Write stops after 3 bytes until it closes
	halfway chan struct{}
}

func (c *splitConn) Write(p []byte) (int, error) {
	if c.hold == nil || len(p) < 4 {
		return c.Conn.Write(p)
	}
	hold := c.hold
	c.hold = nil
	n, err := c.Conn.Write(p[:3])
	if err != nil {
		return n, err
	}
	close(c.halfway)
	<-hold
	m, err := c.Conn.Write(p[3:])
	return n + m, err
}

// TestPartOfAMessageFallsBack: when the poller wakes for part of a
// message, the connection goes back to a reader goroutine, which reads
// the rest when it comes (here: a message a race sale refuses).
func TestPartOfAMessageFallsBack(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the poller is Linux's")
	}
	e := newEnv(t)
	sale := e.addSale(newSale(t, 2, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{}, nil)
	var sc *splitConn
	dialer := &net.Dialer{}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc = &splitConn{Conn: nc}
		return sc, nil
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), hangBound)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, g.url(sale.ID), &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ws.CloseNow() })
	c := &client{t: t, ws: ws}
	c.join(e.token(1))
	c.untilState(StatePrequeue)
	eventually(t, "the connection armed", 10*time.Second, func() bool { return armed(g.room) == 1 })

	release := make(chan struct{})
	sc.halfway = make(chan struct{})
	sc.hold = release
	sent := make(chan error, 1)
	go func() { sent <- ws.Write(ctx, websocket.MessageText, []byte(`{"type":"hello"}`)) }()
	<-sc.halfway
	eventually(t, "a reader goroutine for the rest", 10*time.Second, func() bool { return waiters() == 1 })
	close(release)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	c.expectClose(t, "INVALID", websocket.StatusUnsupportedData)
}
