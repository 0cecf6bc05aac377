package bench

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// wsBareStatus is the baseline's answer to a join: a PREQUEUE status of
// the gateway's shape and about its size.
var wsBareStatus = []byte(`{"type":"status","state":"PREQUEUE","saleId":2,"opensAt":"2026-12-06T23:00:00Z","drawAt":"2026-12-06T22:59:57Z","serverTime":"2026-12-06T22:45:00.000Z"}`)

// wsBare is the WebSocket baseline: what a plain coder/websocket server
// does for a waiting shopper and nothing more. net/http accepts and
// upgrades; the handler reads one message (the join, not parsed),
// writes one fixed status and then reads until the connection ends, which
// answers the client's frames and takes the pongs; one ticker pings each
// connection every wsBarePingSlots ticks, spread by connection as the
// gateway's are (30 s, the gateway's default), each ping in a goroutine
// of its own because Conn.Ping waits for its pong. No Redis, no token, no
// queue: the floor a gateway's waiting room is measured against.
type wsBare struct {
	ctx   context.Context
	mu    sync.Mutex
	conns map[*websocket.Conn]uint64
	seq   uint64
	wg    sync.WaitGroup // handlers and pings
}

const (
	wsBareTick      = 250 * time.Millisecond
	wsBarePingSlots = 120 // × wsBareTick = 30 s
)

// serveWSBaseline serves the baseline on ln until ctx ends, then waits
// for its handlers and pings, whose connections ctx's end closes.
func serveWSBaseline(ctx context.Context, ln net.Listener) error {
	b := &wsBare{ctx: ctx, conns: map[*websocket.Conn]uint64{}}
	srv := &http.Server{Handler: http.HandlerFunc(b.serve), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	t := time.NewTicker(wsBareTick)
	defer t.Stop()
	var err error
loop:
	for tick := uint64(0); ; tick++ {
		select {
		case err = <-errc:
			break loop
		case <-ctx.Done():
			break loop
		case <-t.C:
			b.ping(tick)
		}
	}
	// The listener; the hijacked connections end with ctx, since a
	// coder/websocket read whose context ends closes its connection.
	_ = srv.Close()
	b.wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func (b *wsBare) ping(tick uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for c, seq := range b.conns {
		if seq%wsBarePingSlots != tick%wsBarePingSlots {
			continue
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
			defer cancel()
			if c.Ping(ctx) != nil {
				_ = c.CloseNow()
			}
		}()
	}
}

func (b *wsBare) serve(w http.ResponseWriter, r *http.Request) {
	b.wg.Add(1)
	defer b.wg.Done()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(4096)
	jctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	_, _, err = c.Read(jctx)
	if err == nil {
		err = c.Write(jctx, websocket.MessageText, wsBareStatus)
	}
	cancel()
	if err != nil {
		return
	}
	b.mu.Lock()
	b.seq++
	b.conns[c] = b.seq
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.conns, c)
		b.mu.Unlock()
	}()
	for {
		if _, _, err := c.Read(b.ctx); err != nil {
			return
		}
	}
}
