package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/loadtest"
)

// WSOptions configure RunWS.
type WSOptions struct {
	Exe string // the flashsale-bench binary (`server` is run from it)
	Out string // directory for server logs and ws.txt
	// Conns is the shoppers of one run, all held at once [15,000: a
	// gateway's share of the full drop's 100,000 over 7].
	Conns int
	// Rate is the joins a second of a run [375: 15,000 over 40 s, the
	// one-gateway drop's spread].
	Rate    float64
	Hold    time.Duration // every socket open, nothing else happening [30s: one ping each]
	Rounds  int           // [3]
	Sources int           // client addresses 127.0.1.1…, under the gateway's per-address cap (200) [100]
	// GOMAXPROCS of the server processes [1: as the full drop runs its
	// gateways].
	GOMAXPROCS int
	// ClientProcs is the GOMAXPROCS of this process, the clients', for
	// the run [1: the clients keep to one core, leaving the server the
	// other; a server measured beside clients on both cores costs a
	// quarter to a third more a join, the baseline and the gateway alike].
	ClientProcs int
	// CPUProfile, when set, records CPU profiles of the gateway in every
	// gateway run: of its joins (Out/ws-cpu-join-<round>.pprof) and of its
	// hold (ws-cpu-hold-<round>.pprof), each from its admin port's
	// /debug/pprof/profile, a second shorter than the phase.
	CPUProfile bool
	Progress   io.Writer // one line per run; nil: discard
}

func (o WSOptions) withDefaults() WSOptions {
	if o.Conns <= 0 {
		o.Conns = 15_000
	}
	if o.Rate <= 0 {
		o.Rate = 375
	}
	if o.Hold <= 0 {
		o.Hold = 30 * time.Second
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Sources <= 0 {
		o.Sources = 100
	}
	if o.GOMAXPROCS <= 0 {
		o.GOMAXPROCS = 1
	}
	if o.ClientProcs <= 0 {
		o.ClientProcs = 1
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// WS server names of the samples.
const (
	WSBaseline = "ws-bare"
	WSGateway  = "gateway"
)

// WSSample is one run: Conns shoppers joining at Rate, held for Hold, then
// all closed by the clients. The CPU is the serving process's (Redis's
// apart, the gateway's only) in each phase: the joins (from the first dial
// to the last first status, the waiting of the sockets already in
// included, as the full drop's joins window), the hold and the closes
// (until every client's close returned, and a second more).
type WSSample struct {
	Server                     string
	Round                      int
	Joined, Failed             int
	States                     map[string]int // first message's state ("status" messages), else its type
	Joins, Held                time.Duration  // the joins' wall time, the hold's
	JoinCPU, HoldCPU, CloseCPU time.Duration
	RedisJoin, RedisHold       time.Duration
	LoadAvg                    string // /proc/loadavg before the run
}

func (s WSSample) joinUs() float64  { return perRequestUs(s.JoinCPU, int64(s.Joined)) }
func (s WSSample) closeUs() float64 { return perRequestUs(s.CloseCPU, int64(s.Joined)) }
func (s WSSample) holdUs() float64 {
	if s.Joined == 0 || s.Held <= 0 {
		return 0
	}
	return float64(s.HoldCPU.Nanoseconds()) / 1000 / float64(s.Joined) / s.Held.Seconds()
}

// redisJoinUs and redisHoldUs are the gateway's Redis's share: µs a join
// in the joins, µs a socket a second in the hold.
func (s WSSample) redisJoinUs() float64 { return perRequestUs(s.RedisJoin, int64(s.Joined)) }
func (s WSSample) redisHoldUs() float64 {
	if s.Joined == 0 || s.Held <= 0 {
		return 0
	}
	return float64(s.RedisHold.Nanoseconds()) / 1000 / float64(s.Joined) / s.Held.Seconds()
}

// RunWS starts the WebSocket baseline and a gateway with a sale in its
// pre-queue and runs Rounds rounds of one run each, baseline first. It
// writes ws.txt (Summary) to Out and returns the samples.
func RunWS(ctx context.Context, o WSOptions) ([]WSSample, error) {
	o = o.withDefaults()
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	secretB := make([]byte, 24)
	if _, err := rand.Read(secretB); err != nil {
		return nil, err
	}
	secret := hex.EncodeToString(secretB)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(o.ClientProcs))
	so := Options{Exe: o.Exe, GOMAXPROCS: o.GOMAXPROCS}
	base, err := startServer(ctx, so, filepath.Join(o.Out, "server-ws-bare.log"), "--mode", ModeWSBare)
	if err != nil {
		return nil, err
	}
	defer base.stop()
	gw, err := startServer(ctx, so, filepath.Join(o.Out, "server-ws-gateway.log"), "--mode", ModeGateway, "--jwt-secret", secret, "--queue-sale")
	if err != nil {
		return nil, err
	}
	defer gw.stop()
	if err := gw.command("defense " + strings.ReplaceAll(Permissive, "\n", " ")); err != nil {
		return nil, err
	}
	rdb, err := redisconn.New(redisconn.Config{URL: gw.info.RedisURL})
	if err != nil {
		return nil, err
	}
	defer rdb.Close()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return nil, err
	}
	redisPID, err := infoField(info, "process_id")
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Progress, "ws baseline %s (pid %d), gateway %s (pid %d, sale %d), redis pid %d\n",
		base.info.URL, base.info.PID, gw.info.URL, gw.info.PID, gw.info.QueueSaleID, redisPID)

	var samples []WSSample
	for round := 1; round <= o.Rounds; round++ {
		for _, srv := range []struct {
			name string
			c    *child
		}{{WSBaseline, base}, {WSGateway, gw}} {
			target := wsTarget{
				url:   strings.Replace(srv.c.info.URL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", gw.info.QueueSaleID),
				pid:   srv.c.info.PID,
				first: int64(round) * 1_000_000,
			}
			if srv.name == WSGateway {
				target.redisPID, target.secret = int(redisPID), secret
				if o.CPUProfile {
					target.adminURL = gw.info.AdminURL
					target.profile = filepath.Join(o.Out, fmt.Sprintf("ws-cpu-%%s-%d.pprof", round))
				}
			}
			s, err := runWS(ctx, o, target)
			if err != nil {
				return samples, fmt.Errorf("%s round %d: %w", srv.name, round, err)
			}
			s.Server, s.Round = srv.name, round
			samples = append(samples, s)
			fmt.Fprintf(o.Progress, "round %d %-8s joined %d (failed %d, %v) in %v: %6.1f µs/join  hold %5.2f µs/socket/s  close %5.1f µs/conn  redis %5.1f µs/join %5.2f µs/socket/s  load %s\n",
				round, s.Server, s.Joined, s.Failed, s.States, s.Joins.Round(time.Millisecond), s.joinUs(), s.holdUs(), s.closeUs(), s.redisJoinUs(), s.redisHoldUs(), s.LoadAvg)
			select { // let the closes' last work and the collector settle
			case <-time.After(5 * time.Second):
			case <-ctx.Done():
				return samples, ctx.Err()
			}
		}
	}
	summary := WSSummary(samples, o)
	if err := os.WriteFile(filepath.Join(o.Out, "ws.txt"), []byte(summary), 0o644); err != nil {
		return samples, err
	}
	fmt.Fprint(o.Progress, summary)
	return samples, nil
}

func infoField(info, name string) (int64, error) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("bench: INFO has no %s", name)
}

// wsTarget is one server to run against.
type wsTarget struct {
	url      string
	pid      int
	redisPID int    // 0: no Redis to read
	secret   string // access tokens' key ("": the join carries a dummy one)
	first    int64  // users first+1 … first+Conns
	// adminURL and profile: a CPU profile of each phase into
	// fmt.Sprintf(profile, phase) ("": none).
	adminURL, profile string
}

// profilePhase starts a CPU profile of the phase lasting about d and
// returns a wait for its end; with no profile asked for, or a phase too
// short for one, the wait returns at once.
func (t wsTarget) profilePhase(ctx context.Context, phase string, d time.Duration, progress io.Writer) (wait func()) {
	secs := int(d.Seconds()) - 1
	if t.profile == "" || secs < 1 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := fetchProfile(ctx, t.adminURL, secs, fmt.Sprintf(t.profile, phase)); err != nil {
			fmt.Fprintf(progress, "cpu profile %s: %v\n", phase, err)
		}
	}()
	return func() { <-done }
}

// cpu reads the server's and its Redis's CPU.
func (t wsTarget) cpu() (server, redis time.Duration, err error) {
	if server, err = loadtest.ProcessCPU(t.pid); err != nil || t.redisPID == 0 {
		return server, 0, err
	}
	redis, err = loadtest.ProcessCPU(t.redisPID)
	return server, redis, err
}

func runWS(ctx context.Context, o WSOptions, t wsTarget) (WSSample, error) {
	s := WSSample{States: map[string]int{}, LoadAvg: loadAvg()}
	clients := make([]*http.Client, o.Sources)
	for i := range clients {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+i%250))}, Timeout: 10 * time.Second}
		clients[i] = &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	cctx, cancel := context.WithCancel(ctx)
	closeAll := make(chan struct{})
	var joined, closed sync.WaitGroup
	profiled := func() {}
	defer func() { // every client and profile ends, whatever ended the run
		cancel()
		profiled()
		closed.Wait()
	}()
	var mu sync.Mutex
	var failed atomic.Int64
	var firstErr error

	s0, r0, err := t.cpu()
	if err != nil {
		return s, err
	}
	profiled = t.profilePhase(cctx, "join", time.Duration(float64(o.Conns)/o.Rate*float64(time.Second)), o.Progress)
	start := time.Now()
	for i := range o.Conns {
		if d := time.Until(start.Add(time.Duration(float64(i) / o.Rate * float64(time.Second)))); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return s, ctx.Err()
			}
		}
		joined.Add(1)
		closed.Add(1)
		go func() {
			defer closed.Done()
			c, state, err := wsJoin(cctx, clients[i%len(clients)], t, t.first+int64(i)+1)
			mu.Lock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				failed.Add(1)
			} else {
				s.States[state]++
			}
			mu.Unlock()
			joined.Done()
			if err != nil {
				return
			}
			done := make(chan struct{})
			go func() { // answers pings until the close
				defer close(done)
				for {
					if _, _, err := c.Read(cctx); err != nil {
						return
					}
				}
			}()
			select {
			case <-closeAll:
				_ = c.Close(websocket.StatusNormalClosure, "")
			case <-cctx.Done():
				_ = c.CloseNow()
			}
			<-done
		}()
	}
	joined.Wait()
	s.Joins = time.Since(start)
	s1, r1, err := t.cpu()
	if err != nil {
		return s, err
	}
	s.Failed = int(failed.Load())
	s.Joined = o.Conns - s.Failed
	if s.Failed > 0 {
		return s, fmt.Errorf("%d of %d joins failed, the first: %w", s.Failed, o.Conns, firstErr)
	}
	profiled()
	profiled = t.profilePhase(cctx, "hold", o.Hold, o.Progress)
	holdStart := time.Now()
	select {
	case <-time.After(o.Hold):
	case <-ctx.Done():
		return s, ctx.Err()
	}
	s.Held = time.Since(holdStart)
	profiled()
	s2, r2, err := t.cpu()
	if err != nil {
		return s, err
	}
	close(closeAll)
	closed.Wait()
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		return s, ctx.Err()
	}
	s3, _, err := t.cpu()
	if err != nil {
		return s, err
	}
	s.JoinCPU, s.HoldCPU, s.CloseCPU = s1-s0, s2-s1, s3-s2
	s.RedisJoin, s.RedisHold = r1-r0, r2-r1
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	return s, nil
}

// wsJoin dials, sends the join and reads the first message, returning
// the connection and the message's state.
func wsJoin(ctx context.Context, hc *http.Client, t wsTarget, user int64) (*websocket.Conn, string, error) {
	token := strings.Repeat("x", 180)
	if t.secret != "" {
		var err error
		if token, err = auth.Mint(t.secret, user, false, 2*time.Hour, time.Now()); err != nil {
			return nil, "", err
		}
	}
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(jctx, t.url, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		return nil, "", err
	}
	join, _ := json.Marshal(map[string]string{"type": "join", "accessToken": token})
	if err := c.Write(jctx, websocket.MessageText, join); err != nil {
		c.CloseNow()
		return nil, "", err
	}
	_, msg, err := c.Read(jctx)
	if err != nil {
		c.CloseNow()
		return nil, "", err
	}
	var m struct{ Type, State string }
	if err := json.Unmarshal(msg, &m); err != nil {
		c.CloseNow()
		return nil, "", fmt.Errorf("first message %q: %w", msg, err)
	}
	if m.Type == "error" {
		c.CloseNow()
		return nil, "", fmt.Errorf("join refused: %s", msg)
	}
	if m.Type == "status" {
		return c, m.State, nil
	}
	return c, m.Type, nil
}

// WSSummary renders the samples as ws.txt: medians a server, and the
// gateway's against the baseline.
func WSSummary(samples []WSSample, o WSOptions) string {
	o = o.withDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "\nWebSocket shoppers: %d a run joining at %.0f/s, held %s, then closed by the clients; %d rounds, servers at GOMAXPROCS=%d, the clients (this process) at %d; the clients, the servers and redis-server share this machine's cores.\n\n",
		o.Conns, o.Rate, o.Hold, o.Rounds, o.GOMAXPROCS, o.ClientProcs)
	fmt.Fprintf(&b, "%-8s %-26s %8s %-26s %8s %-26s %8s %-17s  %s\n", "server", "µs/join per run", "median", "µs/socket/s per run", "median", "µs/close per run", "median", "redis join, wait", "load avg before runs")
	meds := map[string][3]float64{}
	for _, name := range []string{WSBaseline, WSGateway} {
		var joins, holds, closes, rjoins, rholds []float64
		var loads []string
		for _, s := range samples {
			if s.Server == name {
				joins, holds, closes = append(joins, s.joinUs()), append(holds, s.holdUs()), append(closes, s.closeUs())
				rjoins, rholds = append(rjoins, s.redisJoinUs()), append(rholds, s.redisHoldUs())
				loads = append(loads, s.LoadAvg)
			}
		}
		if len(joins) == 0 {
			continue
		}
		m := [3]float64{median(joins), median(holds), median(closes)}
		meds[name] = m
		redisCol := "-"
		if name == WSGateway {
			redisCol = fmt.Sprintf("%.1f, %.2f", median(rjoins), median(rholds))
		}
		fmt.Fprintf(&b, "%-8s %-26s %8.1f %-26s %8.2f %-26s %8.1f %-17s  %s\n", name, fmtList(joins, "%.1f"), m[0], fmtList(holds, "%.2f"), m[1],
			fmtList(closes, "%.1f"), m[2], redisCol, strings.Join(loads, " | "))
	}
	if bm, ok := meds[WSBaseline]; ok {
		if gm, ok := meds[WSGateway]; ok && bm[0] > 0 && bm[1] > 0 && bm[2] > 0 {
			fmt.Fprintf(&b, "gateway ÷ baseline: join %.2f×, waiting %.2f×, close %.2f×\n", gm[0]/bm[0], gm[1]/bm[1], gm[2]/bm[2])
		}
	}
	b.WriteString("\nµs/join = the server process's CPU from the first dial to the last first status (the waiting of the sockets already in included) ÷ joins; µs/socket/s = its CPU over the hold ÷ sockets ÷ seconds; µs/close = its CPU from the clients' closes to a second after the last returned ÷ sockets; redis join, wait = the gateway's Redis, µs a join in the joins and µs a socket a second in the hold (not in the gateway's columns).\n")
	return b.String()
}

func fmtList(xs []float64, f string) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf(f, x)
	}
	return strings.Join(out, " ")
}
