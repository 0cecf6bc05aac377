package waitroom

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// expectClose reads until the server's error message and close.
func (c *client) expectClose(t *testing.T, code string, status websocket.StatusCode) {
	t.Helper()
	var got msg
	for {
		m, err := c.read(10 * time.Second)
		if err != nil {
			if got.Error != code {
				t.Fatalf("error message %q, want %q (close: %v)", got.Error, code, err)
			}
			if s := websocket.CloseStatus(err); s != status {
				t.Fatalf("close status %v, want %v (%v)", s, status, err)
			}
			return
		}
		if m.Type == TypeError {
			got = m
		}
	}
}

func TestBadInput(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Run("cases", func(t *testing.T) { // its cleanups run before the leak check
		e := newEnv(t)
		sale := e.addSale(newSale(t, 2, e.clock.Now().Add(time.Minute), 10, 10))
		g := e.newGateway(Config{MaxMessageBytes: 256, HandshakeTimeout: 300 * time.Millisecond, MaxConnsPerUser: 2},
			guardFunc(func(userID int64, pow json.RawMessage) (json.RawMessage, error) {
				if userID == 666 {
					return nil, flashsale.Errorf(flashsale.CodeBlocked, "blocked")
				}
				return nil, nil
			}))
		good := e.token(1)
		tests := []struct {
			name   string
			sale   int64
			send   []string
			code   string
			status websocket.StatusCode
		}{
			{"garbage", sale.ID, []string{"not json at all"}, "INVALID", websocket.StatusUnsupportedData},
			{"non-join first", sale.ID, []string{`{"type":"hello"}`}, "INVALID", websocket.StatusUnsupportedData},
			{"oversized", sale.ID, []string{`{"type":"join","accessToken":"` + strings.Repeat("a", 1000) + `"}`}, "TOO_LARGE", websocket.StatusMessageTooBig},
			{"missing token", sale.ID, []string{`{"type":"join"}`}, "UNAUTHENTICATED", websocket.StatusPolicyViolation},
			{"bad token", sale.ID, []string{`{"type":"join","accessToken":"x.y.z"}`}, "UNAUTHENTICATED", websocket.StatusPolicyViolation},
			{"blocked", sale.ID, []string{`{"type":"join","accessToken":"` + e.token(666) + `"}`}, "BLOCKED", websocket.StatusPolicyViolation},
			{"unknown sale", 999, nil, "NOT_FOUND", websocket.StatusPolicyViolation},
			{"second join", sale.ID, []string{`{"type":"join","accessToken":"` + good + `"}`, `{"type":"join","accessToken":"` + good + `"}`}, "INVALID", websocket.StatusUnsupportedData},
			{"handshake timeout", sale.ID, nil, "INVALID", websocket.StatusUnsupportedData},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := dial(t, g.url(tt.sale))
				for _, s := range tt.send {
					c.send(s)
				}
				c.expectClose(t, tt.code, tt.status)
			})
		}
		t.Run("expired token", func(t *testing.T) {
			expired, err := auth.Mint(jwtSecret, 3, false, -time.Hour, e.clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			c := dial(t, g.url(sale.ID))
			c.join(expired)
			c.expectClose(t, "UNAUTHENTICATED", websocket.StatusPolicyViolation)
		})
		t.Run("per-user cap", func(t *testing.T) {
			a, b, c := dial(t, g.url(sale.ID)), dial(t, g.url(sale.ID)), dial(t, g.url(sale.ID))
			a.join(e.token(77))
			a.untilState(StatePrequeue)
			b.join(e.token(77))
			b.untilState(StatePrequeue)
			c.join(e.token(77))
			c.expectClose(t, "RATE_LIMITED", websocket.StatusTryAgainLater)
		})
		t.Run("not a websocket", func(t *testing.T) {
			resp, err := http.Get(g.srv.URL + SalePath + "2/queue")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUpgradeRequired {
				t.Fatalf("status %d, want 426", resp.StatusCode)
			}
		})
		// The server still serves others.
		ok := dial(t, g.url(sale.ID))
		ok.join(e.token(5))
		ok.untilState(StatePrequeue)
	})
	// Every goroutine of the rooms, servers and clients is gone.
	testenv.EventuallyF(t, func() string {
		buf := make([]byte, 1<<20)
		return fmt.Sprintf("the goroutines to end: %d before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}, 15*time.Second, func() bool { return runtime.NumGoroutine() <= before })
}

func TestPerIPCap(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 2, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{MaxConnsPerIP: 2}, nil)
	dial(t, g.url(sale.ID))
	dial(t, g.url(sale.ID))
	eventually(t, "two connections counted", 5*time.Second, func() bool {
		g.room.mu.Lock()
		defer g.room.mu.Unlock()
		return len(g.room.conns) == 2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, g.url(sale.ID), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third connection: err %v resp %v, want 429", err, resp)
	}
}

// TestProcessCap: past MaxConns the process refuses upgrades with 503 and
// Retry-After (it keeps its file descriptors for Redis and Kafka); a freed
// place is usable again.
func TestProcessCap(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 3, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{MaxConns: 2}, nil)
	first := dial(t, g.url(sale.ID))
	dial(t, g.url(sale.ID))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, g.url(sale.ID), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third connection: err %v resp %v, want 503 with Retry-After", err, resp)
	}
	first.ws.Close(websocket.StatusNormalClosure, "")
	eventually(t, "a place freed", 5*time.Second, func() bool {
		c, _, err := websocket.Dial(ctx, g.url(sale.ID), nil)
		if err != nil {
			return false
		}
		c.CloseNow()
		return true
	})
}

// TestSlowReaderDropped: a client that stops reading is dropped after the
// write timeout; the others keep getting their statuses.
func TestSlowReaderDropped(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 6, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{WriteTimeout: 200 * time.Millisecond}, nil)
	cs := prequeued(t, e, g, sale.ID, 2)
	slow, fast := cs[0], cs[1]
	var sc *conn
	g.room.mu.Lock()
	for c := range g.room.conns {
		if c.user == 1 {
			sc = c
		}
	}
	g.room.mu.Unlock()
	if sc == nil {
		t.Fatal("no server conn for the slow client")
	}
	// Far more than the socket buffers hold; the slow client reads nothing.
	big := []byte(`"` + strings.Repeat("x", 16<<20) + `"`)
	sc.pushRaw(big)
	eventually(t, "slow client dropped", 10*time.Second, func() bool {
		g.room.mu.Lock()
		defer g.room.mu.Unlock()
		_, still := g.room.conns[sc]
		return !still
	})
	e.clock.Advance(time.Minute) // opening: the fast client hears it
	fast.untilState(StateWaiting)
	// The slow client's connection is closed (after what was in flight).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if _, _, err := slow.ws.Read(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatal("slow client never saw its connection close")
			}
			break
		}
	}
}

// TestDropSlowWrites: the watch closes the connection of a writer that
// has been writing for longer than WriteTimeout, and no other: not one
// within it, not a slot with nothing under way.
func TestDropSlowWrites(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 6, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{WriteTimeout: time.Hour}, nil) // the room's own watch never fires here
	cs := prequeued(t, e, g, sale.ID, 2)
	server := map[int64]*conn{}
	g.room.mu.Lock()
	for c := range g.room.conns {
		server[c.user] = c
	}
	g.room.mu.Unlock()
	if server[1] == nil || server[2] == nil {
		t.Fatalf("server conns %v, want users 1 and 2", server)
	}
	now := g.room.monotonic()
	slots := make([]writeSlot, 3)
	slots[0].c.Store(server[1])
	slots[0].since.Store(now - int64(time.Hour) - 1) // past the timeout
	slots[1].c.Store(server[2])
	slots[1].since.Store(now - int64(time.Hour) + int64(time.Second)) // within it
	slots[2].c.Store(server[2])                                       // since 0: nothing under way
	g.room.dropSlowWrites(slots, now)
	eventually(t, "the slow writer's client dropped", 10*time.Second, func() bool {
		g.room.mu.Lock()
		defer g.room.mu.Unlock()
		_, still := g.room.conns[server[1]]
		return !still
	})
	e.clock.Advance(time.Minute) // opening: the other client hears it
	cs[1].untilState(StateWaiting)
	g.room.mu.Lock()
	_, kept := g.room.conns[server[2]]
	g.room.mu.Unlock()
	if !kept {
		t.Fatal("a connection within the timeout, or with no write under way, was dropped")
	}
}

func TestShutdownGoingAway(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 2, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{}, nil)
	c := dial(t, g.url(sale.ID))
	c.join(e.token(1))
	c.untilState(StatePrequeue)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- g.room.Shutdown(ctx)
	}()
	_, err := c.read(10 * time.Second)
	if s := websocket.CloseStatus(err); s != websocket.StatusGoingAway {
		t.Fatalf("close status %v (%v), want 1001", s, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// A shopper who connects while the gateway shuts down is told to
	// retry (elsewhere), as every 503 of the contract is.
	req, err := http.NewRequest("GET", strings.Replace(g.url(sale.ID), "ws://", "http://", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Upgrade", "websocket")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("connect after Shutdown: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestOneWriterPerConn: messages queued while a writer is sending a
// connection's earlier ones wait for it, then leave in their order (the
// status before the operator's message), each once. Two writers sending
// one connection's messages at once could put the message first.
func TestOneWriterPerConn(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 6, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{Writers: 4, WriteTimeout: 30 * time.Second}, nil)
	cl := prequeued(t, e, g, sale.ID, 1)[0]
	cl.ws.SetReadLimit(64 << 20)
	var sc *conn
	g.room.mu.Lock()
	for c := range g.room.conns {
		sc = c
	}
	g.room.mu.Unlock()
	// More than the socket buffers hold: the writer stays in this write
	// until the client reads.
	big := []byte(`"` + strings.Repeat("x", 16<<20) + `"`)
	sc.pushRaw(big)
	eventually(t, "a writer sending the big payload", 10*time.Second, func() bool {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		return sc.writing && sc.pendRaw == nil
	})
	sc.pushMessage(appendMessage(nil, "doors open soon", 1))
	// A second writer has taken the connection off the queue before the
	// status comes: it must not send the message ahead of the first.
	eventually(t, "a writer taking the message's turn", 10*time.Second, func() bool {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		return !sc.queued
	})
	sc.push(view{state: StatePrequeue, position: 7}, 1, nil)
	var got []string
	for !slices.Contains(got, "message") {
		_, b, err := cl.ws.Read(context.Background())
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		switch {
		case bytes.Equal(b, big):
			got = append(got, "raw")
		case bytes.Contains(b, []byte(`"type":"status"`)):
			got = append(got, "status")
		case bytes.Contains(b, []byte(`"type":"message"`)):
			got = append(got, "message")
		default:
			t.Fatalf("unexpected message %.80q", b)
		}
	}
	// Statuses of the room's own may come too; the order is what counts.
	if len(got) < 3 || got[0] != "raw" || got[len(got)-2] != "status" {
		t.Fatalf("messages %v, want the big payload, then the status, then the message", got)
	}
	eventually(t, "nothing left pending or queued", 10*time.Second, func() bool {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		return !sc.writing && !sc.hasPend && sc.pendMsg == nil && !sc.queued && !sc.queuedHi
	})
}

// TestJoinsWithoutSolutionDoNotHoldTheHandshake: a client that answers
// every challenge with another join without a solution is closed once
// the handshake timeout, extended by the first challenge only, runs out.
func TestJoinsWithoutSolutionDoNotHoldTheHandshake(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 2, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{HandshakeTimeout: 300 * time.Millisecond},
		guardFunc(func(_ int64, pow json.RawMessage) (json.RawMessage, error) {
			if pow == nil {
				return []byte(`{"difficulty":4,"prefix":"ab"}`), nil
			}
			return nil, nil
		}))
	c := dial(t, g.url(sale.ID))
	tok := e.token(9)
	c.join(tok)
	deadline := time.Now().Add(10 * time.Second)
	for joins := 1; ; joins++ {
		m, err := c.read(time.Until(deadline))
		if err != nil {
			if s := websocket.CloseStatus(err); s != websocket.StatusUnsupportedData {
				t.Fatalf("after %d joins: %v (close %v), want close 1003 at the handshake timeout", joins, err, s)
			}
			return
		}
		switch m.Type {
		case TypeChallenge:
			c.join(tok) // again, without a solution
		case TypeError:
			if m.Error != "INVALID" {
				t.Fatalf("error %q, want INVALID", m.Error)
			}
		default:
			t.Fatalf("unexpected message %+v", m)
		}
	}
}

// TestBinaryJoinRefused: a join in a binary frame is refused with 1003,
// though its bytes are a valid join.
func TestBinaryJoinRefused(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 2, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{}, nil)
	c := dial(t, g.url(sale.ID))
	b, _ := json.Marshal(map[string]string{"type": "join", "accessToken": e.token(4)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageBinary, b); err != nil {
		t.Fatal(err)
	}
	c.expectClose(t, "INVALID", websocket.StatusUnsupportedData)
}

// TestWebSocketJoinGivesDrawSecret: the first status after a WebSocket
// join carries the shopper's member secret, the one the polling status
// gives on any gateway; the statuses after it do not repeat it.
func TestWebSocketJoinGivesDrawSecret(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 6, e.clock.Now().Add(time.Minute), 10, 10))
	g := e.newGateway(Config{}, nil)
	c := dial(t, g.url(sale.ID))
	c.join(e.token(7))
	first := c.untilState(StatePrequeue)
	want := g.room.MemberSecret(sale.ID, 7)
	if first.DrawSecret != want || len(want) != 2*MemberSecretBytes {
		t.Fatalf("first status drawSecret %q, want %q", first.DrawSecret, want)
	}
	if other := e.newGateway(Config{}, nil).room.MemberSecret(sale.ID, 7); other != want {
		t.Fatalf("another gateway's secret %q, want %q", other, want)
	}
	e.clock.Advance(time.Minute) // the opening: a new status
	next := c.until("a status after the opening", 10*time.Second, func(m msg) bool {
		return m.Type == TypeStatus && m.State != StatePrequeue
	})
	if next.DrawSecret != "" {
		t.Fatalf("a later status repeats drawSecret %q", next.DrawSecret)
	}
}

// TestRejoinShowsTheEarlierChoice: in queue order, a shopper's second
// connection (another tab, a reconnect) shows in its first status the
// item chosen on the first; the join's own script reads the choice.
func TestRejoinShowsTheEarlierChoice(t *testing.T) {
	e := newEnv(t)
	sale := newSale(t, 1, e.clock.Now().Add(time.Hour), 10, 5)
	sale.Allocation, sale.ClaimWindow = flashsale.AllocationQueue, time.Minute
	sale.Items = append(sale.Items, flashsale.Item{ID: 1002, SaleID: 1, ProductID: 502, Quantity: 5, PriceCents: 999})
	e.addSale(sale)
	g := e.newGateway(Config{}, nil)
	tok := e.token(7)

	first := dial(t, g.url(sale.ID))
	first.join(tok)
	if m := first.untilState(StatePrequeue); m.ChosenItemID != 0 {
		t.Fatalf("first status chose %d before any choice", m.ChosenItemID)
	}
	first.send(`{"type":"choose","itemId":1002}`)
	first.until("the chosen item in a status", hangBound, func(m msg) bool { return m.Type == TypeStatus && m.ChosenItemID == 1002 })

	second := dial(t, g.url(sale.ID))
	second.join(tok)
	if m := second.untilState(StatePrequeue); m.ChosenItemID != 1002 {
		t.Errorf("the second connection's first status chose %d, want 1002", m.ChosenItemID)
	}
	// Another shopper's join shows no choice.
	other := dial(t, g.url(sale.ID))
	other.join(e.token(8))
	if m := other.untilState(StatePrequeue); m.ChosenItemID != 0 {
		t.Errorf("another shopper's first status chose %d, want none", m.ChosenItemID)
	}
}
