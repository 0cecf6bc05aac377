package waitroom

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkJoin measures polling joins including the access-token check,
// each a distinct user (one batched script call per batch in Redis).
// joins/s/core = joins per second divided by GOMAXPROCS.
func BenchmarkJoin(b *testing.B) {
	e := newEnv(b)
	sale := e.addSale(newSale(b, 1, e.clock.Now().Add(time.Hour), 1000, 1000))
	g := e.newGateway(Config{Tick: time.Second}, nil)
	tokens := make([]string, b.N)
	for i := range tokens {
		tokens[i] = e.token(int64(i + 1))
	}
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	b.SetParallelism(64) // joins wait on a batch: many in flight per core
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1) - 1
			p, err := e.access.Verify(tokens[i])
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := g.room.Join(context.Background(), p, sale.ID, testIP, nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(b.N)/el/float64(runtime.GOMAXPROCS(0)), "joins/s/core")
}

// rawClient is a minimal WebSocket client (a bare TCP connection), so that
// the benchmark's own memory per connection is small next to the server's.
type rawClient struct {
	nc net.Conn
	br *bufio.Reader
}

func dialRaw(addr string, local net.IP, saleID int64, token string) (*rawClient, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local}, Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	req := "GET " + SalePath + strconv.FormatInt(saleID, 10) + "/queue HTTP/1.1\r\nHost: " + addr +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	if _, err := io.WriteString(nc, req); err != nil {
		nc.Close()
		return nil, err
	}
	c := &rawClient{nc: nc, br: bufio.NewReaderSize(nc, 256)}
	for {
		line, err := c.br.ReadString('\n')
		if err != nil {
			nc.Close()
			return nil, err
		}
		if line == "\r\n" {
			break
		}
	}
	join, _ := json.Marshal(map[string]string{"type": "join", "accessToken": token})
	// One masked text frame with a zero mask key (the payload unchanged).
	frame := []byte{0x81, 0x80 | 126, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(frame[2:], uint16(len(join)))
	if _, err := nc.Write(append(frame, join...)); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// next reads one server frame (unmasked, payload < 64 KiB).
func (c *rawClient) next() ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return nil, err
	}
	n := int(h[1] & 0x7f)
	if n == 126 {
		var ext [2]byte
		if _, err := io.ReadFull(c.br, ext[:]); err != nil {
			return nil, err
		}
		n = int(binary.BigEndian.Uint16(ext[:]))
	}
	p := make([]byte, n)
	_, err := io.ReadFull(c.br, p)
	return p, err
}

// BenchmarkConnections holds FLASHSALE_BENCH_CONNS (default 2000) WebSockets
// on one Room and reports the memory per connection (heap + stacks, both
// sides of the connection, as the client shares the process; the raw client
// costs a few hundred bytes) and the time to push one status change to all
// of them (tick to last frame read). Client sockets are spread over
// 127.0.0.x source addresses.
func BenchmarkConnections(b *testing.B) {
	n := 2000
	if s := os.Getenv("FLASHSALE_BENCH_CONNS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("FLASHSALE_BENCH_CONNS=%q", s)
		}
		n = v
	}
	e := newEnv(b)
	sale := e.addSale(newSale(b, 1, e.clock.Now().Add(time.Hour), 0, 1000))
	item := sale.Items[0].ID
	cfg := Config{Tick: time.Hour, MaxConnsPerIP: n + 1, IdleTimeout: 24 * time.Hour, HandshakeTimeout: time.Minute, Now: e.clock.Now}
	r := New(cfg, e.rdb, e.sales, e.stock, e.access, e.signer, nil, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	srv := httptest.NewUnstartedServer(r)
	srv.Config.ReadHeaderTimeout = 10 * time.Second
	srv.Start()
	b.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		_ = r.Shutdown(sctx)
		srv.Close()
		cancel()
		<-done
	})
	addr := strings.TrimPrefix(srv.URL, "http://")
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = e.token(int64(i + 1))
	}

	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	clients := make([]*rawClient, n)
	for i := range clients {
		local := net.IPv4(127, 0, byte(1+i/20000), byte(2+i/250%250))
		c, err := dialRaw(addr, local, sale.ID, tokens[i])
		if err != nil {
			b.Fatalf("connection %d: %v", i, err)
		}
		clients[i] = c
	}
	b.Cleanup(func() {
		for _, c := range clients {
			c.nc.Close()
		}
	})
	for i, c := range clients { // first status: joined
		if _, err := c.next(); err != nil {
			b.Fatalf("connection %d: first status: %v", i, err)
		}
	}
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	perConn := float64((m1.HeapAlloc+m1.StackInuse)-(m0.HeapAlloc+m0.StackInuse)) / float64(n)

	soldOut := false
	b.ResetTimer()
	for b.Loop() {
		soldOut = !soldOut
		if soldOut {
			e.stock.set(sale.ID, item, 0)
		} else {
			e.stock.set(sale.ID, item, 1000)
		}
		r.tickAll(ctx)
		for i, c := range clients {
			if _, err := c.next(); err != nil {
				b.Fatalf("connection %d: %v", i, err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(perConn, "bytes/conn")
	b.ReportMetric(float64(m1.StackInuse-m0.StackInuse)/float64(n), "stack-bytes/conn")
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/push-all")
	b.ReportMetric(float64(n), "conns")
}
