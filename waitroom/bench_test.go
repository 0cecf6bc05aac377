package waitroom

import (
	"context"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
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
			if _, err := g.room.Join(context.Background(), p, sale.ID, testIP, nil, ""); err != nil {
				b.Error(err)
				return
			}
		}
	})
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(b.N)/el/float64(runtime.GOMAXPROCS(0)), "joins/s/core")
}

// connBench is one Room on real Redis behind a net/http server in this
// process, with n WebSockets joined from client processes
// (benchclient_test.go).
type connBench struct {
	e       *env
	r       *Room
	ctx     context.Context
	saleID  int64
	itemID  int64
	n       int
	clients *clientFleet
	before  serverMem
	after   serverMem

	goroutines0, goroutines1 int
	fds                      int           // open files of this process, all joined
	joinCPU                  time.Duration // this process's CPU while the n connections joined
}

// startConnBench starts the room and its server, measures the process's
// memory, has n connections join from client processes and measures again.
func startConnBench(tb testing.TB, n int) *connBench {
	tb.Helper()
	if lim, err := raiseNoFile(); err != nil {
		tb.Fatal(err)
	} else if uint64(n)+200 > lim {
		tb.Fatalf("%d connections need more than the %d open files this process may hold", n, lim)
	}
	e := newEnv(tb)
	sale := e.addSale(newSale(tb, 1, e.clock.Now().Add(time.Hour), 0, 1000))
	// Ticks only when the benchmark calls tickAll. IdleTimeout/2/Tick = 120
	// ping slots, as with the defaults (60 s, 250 ms): each tick pings 1/120
	// of the connections, as in production.
	cfg := Config{Tick: time.Hour, IdleTimeout: 240 * time.Hour, MaxConnsPerIP: n + 1,
		HandshakeTimeout: 5 * time.Minute, Now: e.clock.Now,
		ResumeDelay: -1} // the clock stands still: no hold after a restock
	r := New(cfg, e.rdb, e.sales, e.stock, e.access, e.signer, nil, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	srv := httptest.NewUnstartedServer(r)
	srv.Config.ReadHeaderTimeout = 30 * time.Second
	srv.Start()
	tb.Cleanup(func() { // after the clients' cleanup (LIFO): they close first
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		_ = r.Shutdown(sctx)
		srv.Close()
		cancel()
		<-done
	})
	h := &connBench{e: e, r: r, ctx: ctx, saleID: sale.ID, itemID: sale.Items[0].ID, n: n}
	h.before = readServerMem(tb)
	h.goroutines0 = runtime.NumGoroutine()
	cpu0 := selfCPU(tb)
	h.clients = startClients(tb, strings.TrimPrefix(srv.URL, "http://"), sale.ID, n, e.clock.Now().UnixMilli())
	h.joinCPU = selfCPU(tb) - cpu0
	h.after = readServerMem(tb)
	h.goroutines1 = runtime.NumGoroutine()
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		h.fds = len(fds)
	}
	r.mu.Lock()
	held := len(r.conns)
	r.mu.Unlock()
	if held != n {
		tb.Fatalf("the room holds %d connections, want %d", held, n)
	}
	return h
}

// push changes every connection's status (odd rounds: the stock goes to 0,
// SOLD_OUT; even rounds: back, PREQUEUE), runs one tick and waits until
// every client has read the new status. It returns the time from the
// change to the last client's receipt, the tick's own time (compute and
// queue every status; the writers send meanwhile) and the time until the
// writers have taken the last status off the queue (the server's side of
// the push, up to the last Writer-many writes).
func (h *connBench) push(tb testing.TB, round int) (all, tick, drain time.Duration) {
	tb.Helper()
	start := time.Now()
	if round%2 == 1 {
		h.e.stock.set(h.saleID, h.itemID, 0)
	} else {
		h.e.stock.set(h.saleID, h.itemID, 1000)
	}
	h.r.tickAll(h.ctx, true)
	tick = time.Since(start)
	for { // until the writers have taken every queued status (≤ 1 ms late)
		h.r.sendMu.Lock()
		q := len(h.r.sendQ)
		h.r.sendMu.Unlock()
		if q == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	drain = time.Since(start)
	h.clients.waitRound(tb, round)
	return time.Since(start), tick, drain
}

// BenchmarkConnections holds FLASHSALE_BENCH_CONNS (default 19,000)
// WebSockets on one Room (real Redis, net/http server) in this process;
// the clients are 2+ child processes (≤ 9,500 connections each, from
// 127.<child>.0.x source addresses), so every number below is the server
// side alone.
//
// Memory per connection, this process after a GC, from before the first
// dial to after the last join: heap in use (HeapInuse), live heap
// (HeapAlloc), goroutine stacks (StackInuse), goroutines, and RSS (VmRSS
// after returning free pages to the OS: everything the process holds, heap
// and stacks included, but not the kernel's socket buffers; peak-rss is
// VmHWM, the high-water mark while connecting).
//
// Push to all: from the stock change (0 → SOLD_OUT, back → PREQUEUE)
// through one tick until every client has read the new status
// (ms/push-all the mean, push-p50-ms the median, push-max-ms the slowest;
// tick-ms the tick's own share, drain-ms until the writers took the last
// status off the queue). server-cpu-ms/push and client-cpu-ms/push are the
// CPU time (user + system) this process and the client processes spent
// per push: here they share the same 2 cores, so the push time includes the
// clients' reads and, over loopback, the kernel's receive path.
// server-cpu-us/join is this process's CPU while the connections joined,
// per connection: the upgrade, the join's read, token check and batched
// script, the first status, as fast as the clients dial.
func BenchmarkConnections(b *testing.B) {
	n := 19000
	if s := os.Getenv("FLASHSALE_BENCH_CONNS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("FLASHSALE_BENCH_CONNS=%q", s)
		}
		n = v
	}
	h := startConnBench(b, n)
	var total, worst, ticks, drains time.Duration
	var rounds []string
	var all []time.Duration
	round := 0
	server0, clients0 := selfCPU(b), h.clients.cpu(b)
	b.ResetTimer()
	for b.Loop() {
		round++
		d, tick, drain := h.push(b, round)
		total += d
		ticks += tick
		drains += drain
		worst = max(worst, d)
		all = append(all, d)
		if len(rounds) < 100 {
			rounds = append(rounds, strconv.FormatInt(d.Milliseconds(), 10))
		}
	}
	b.StopTimer()
	server1, clients1 := selfCPU(b), h.clients.cpu(b)
	perRound := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(round) }
	b.Logf("%d connections; push to all, ms per round: %s", n, strings.Join(rounds, " "))
	per := func(v int64) float64 { return float64(v) / float64(n) }
	b.ReportMetric(per(int64(h.after.heapInuse)-int64(h.before.heapInuse)), "heap-B/conn")
	b.ReportMetric(per(int64(h.after.heapAlloc)-int64(h.before.heapAlloc)), "live-B/conn")
	b.ReportMetric(per(int64(h.after.stack)-int64(h.before.stack)), "stack-B/conn")
	b.ReportMetric(per(1024*(h.after.rssKB-h.before.rssKB)), "rss-B/conn")
	b.ReportMetric(per(1024*(h.after.hwmKB-h.before.hwmKB)), "peak-rss-B/conn")
	b.ReportMetric(float64(h.goroutines1-h.goroutines0)/float64(n), "goroutines/conn")
	b.ReportMetric(perRound(total), "ms/push-all")
	slices.Sort(all)
	b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "push-p50-ms")
	b.ReportMetric(float64(worst.Microseconds())/1000, "push-max-ms")
	b.ReportMetric(perRound(ticks), "tick-ms")
	b.ReportMetric(perRound(drains), "drain-ms")
	b.ReportMetric(perRound(server1-server0), "server-cpu-ms/push")
	b.ReportMetric(perRound(clients1-clients0), "client-cpu-ms/push")
	b.ReportMetric(float64(h.joinCPU.Nanoseconds())/1000/float64(n), "server-cpu-us/join")
	b.ReportMetric(float64(n), "conns")
	b.ReportMetric(float64(h.fds), "open-files")
}
