package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// gatewayProc is one `flashsale gateway` process built by the test.
type gatewayProc struct {
	id         string
	api, admin string
	cmd        *exec.Cmd
	log        *lockedWriter
	done       chan struct{}
}

// buildFlashsale builds the binary into a temporary directory.
func buildFlashsale(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "flashsale")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func startGateway(t *testing.T, bin, id string, env []string) *gatewayProc {
	t.Helper()
	ports := [2]int{}
	for i := range ports {
		p, err := localsvc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	g := &gatewayProc{
		id:    id,
		api:   fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		admin: fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		log:   &lockedWriter{},
		done:  make(chan struct{}),
	}
	g.cmd = exec.Command(bin, "gateway")
	g.cmd.Env = append(append(os.Environ(), env...),
		"FLASHSALE_GATEWAY_ID="+id,
		fmt.Sprintf("FLASHSALE_HTTP_ADDR=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("FLASHSALE_ADMIN_ADDR=127.0.0.1:%d", ports[1]),
		"FLASHSALE_LOG_FORMAT=text",
	)
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.cmd.Wait(); close(g.done) }()
	t.Cleanup(func() {
		_ = g.cmd.Process.Kill()
		<-g.done
	})
	return g
}

// settingsVersion reads the version a gateway enforces from its metrics.
func (g *gatewayProc) settingsVersion() int64 {
	r, err := http.Get(g.admin + "/metrics")
	if err != nil {
		return -1
	}
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "flashsale_defense_settings_version "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return int64(n)
			}
		}
	}
	return -1
}

type fleetCounter struct {
	Rule     string            `json:"rule"`
	Outcome  string            `json:"outcome"`
	Count    uint64            `json:"count"`
	Gateways map[string]uint64 `json:"gateways"`
}

// perUserLimited reads GET /api/admin/defense on g: the fleet's per-user
// refusals and their split by gateway.
func (g *gatewayProc) perUserLimited(t *testing.T, op string) (uint64, map[string]uint64, bool) {
	t.Helper()
	req, _ := http.NewRequest("GET", g.api+"/api/admin/defense", nil)
	req.Header.Set("Authorization", "Bearer "+op)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, false
	}
	defer r.Body.Close()
	var list []fleetCounter
	if r.StatusCode != 200 || json.NewDecoder(r.Body).Decode(&list) != nil {
		return 0, nil, false
	}
	for _, c := range list {
		if c.Rule == "perUser" && c.Outcome == "limited" {
			return c.Count, c.Gateways, true
		}
	}
	return 0, nil, false
}

// spray sends one user's requests to the gateways in turn, one request
// every pace per gateway, for span, and counts the answers: through (any
// answer but 429) and refused (429).
func spray(t *testing.T, gws []*gatewayProc, tok string, pace, span time.Duration) (through, refused int64, elapsed time.Duration) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 10 * time.Second}
	var th, rf, other atomic.Int64
	start := time.Now()
	stop := start.Add(span)
	var wg sync.WaitGroup
	for _, g := range gws {
		wg.Go(func() {
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for time.Now().Before(stop) {
				<-tick.C
				req, _ := http.NewRequest("GET", g.api+"/api/flash-sales/sales/999999/order", nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				r, err := client.Do(req)
				if err != nil {
					other.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, r.Body)
				r.Body.Close()
				switch {
				case r.StatusCode == 429:
					rf.Add(1)
				case r.StatusCode >= 200 && r.StatusCode < 500:
					th.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed = time.Since(start)
	if n := other.Load(); n > 0 {
		t.Errorf("%d requests failed or got 5xx", n)
	}
	return th.Load(), rf.Load(), elapsed
}

// TestFleetRateLimitAcrossGatewayProcesses runs three real gateway
// processes on one Redis. One user's requests sprayed over all three get
// at most 1.2 × R per second through (plus each gateway's burst); the same
// user on one gateway only (a sticky balancer) still gets about R, not R/3.
// The admin API's refusal figures are the sum over the gateways, with each
// gateway's share, and a gateway killed with -9 drops out of the sum.
func TestFleetRateLimitAcrossGatewayProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three gateway processes")
	}
	bin := buildFlashsale(t)
	const secret = "fleet-secret-0123456789abcdef-fleet"
	k := testenv.NewKafka(t)
	env := []string{
		"FLASHSALE_REDIS_URL=" + testenv.RedisURL(t),
		"FLASHSALE_DATABASE_URL=" + testenv.DatabaseURL(t),
		"FLASHSALE_KAFKA_BROKERS=" + k.BrokerList(),
		"FLASHSALE_JWT_SECRET=" + secret,
		"FLASHSALE_DEFENSE_SHARE_INTERVAL=100ms",
	}
	mint := func(user int64, op bool) string {
		tok, err := auth.Mint(secret, user, op, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	op := mint(1, true)

	var gws []*gatewayProc
	for i := range 3 {
		gws = append(gws, startGateway(t, bin, fmt.Sprintf("gw-%d", i), env))
	}
	for _, g := range gws {
		if !testenv.Wait(90*time.Second, func() bool {
			st, _ := call(t, "GET", g.admin+"/readyz", "")
			return st == 200
		}) {
			t.Fatalf("%s not ready:\n%s", g.id, g.log)
		}
	}

	// The operator's polling has a per-user bucket of its own (class
	// admin), so only the sprayed users' refusals are counted.
	const (
		rps   = 20
		burst = 5
	)
	body := fmt.Sprintf(`{"rateLimit": {"perIp": {"rps": 100000, "burst": 100000}, "perUser": {"rps": %d, "burst": %d}, "classes": {"admin": {"perUser": {"rps": 1000, "burst": 1000}}}}, "pow": {"difficulty": 0}, "blocklist": {}}`, rps, burst)
	req, _ := http.NewRequest("PUT", gws[0].api+"/api/admin/settings", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+op)
	req.Header.Set("Content-Type", "application/json")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var stored struct {
		Version int64 `json:"version"`
	}
	_ = json.NewDecoder(r.Body).Decode(&stored)
	r.Body.Close()
	if r.StatusCode != 200 || stored.Version == 0 {
		t.Fatalf("PUT settings: %d, version %d", r.StatusCode, stored.Version)
	}
	for _, g := range gws {
		if !testenv.Wait(30*time.Second, func() bool { return g.settingsVersion() == stored.Version }) {
			t.Fatalf("%s does not enforce settings version %d", g.id, stored.Version)
		}
	}

	// Spray: 3 gateways × 100 requests per second = 15 × the limit.
	through, refused, elapsed := spray(t, gws, mint(42, false), 10*time.Millisecond, 4*time.Second)
	bound := 1.2*rps*elapsed.Seconds() + float64(len(gws)*burst)
	t.Logf("spray over %d gateways for %s: %d through, %d refused (bound %.0f; R·W = %.0f)",
		len(gws), elapsed.Round(time.Millisecond), through, refused, bound, rps*elapsed.Seconds())
	if float64(through) > bound {
		t.Errorf("spray got %d through in %s, want at most 1.2 × %d/s × W + %d × %d = %.0f",
			through, elapsed.Round(time.Millisecond), rps, len(gws), burst, bound)
	}
	if refused == 0 {
		t.Fatal("nothing was refused: the spray did not reach the limit")
	}

	// Sticky: the same limit on one gateway is the whole limit, not R/3.
	stickyThrough, stickyRefused, stickyElapsed := spray(t, gws[:1], mint(43, false), 10*time.Millisecond, 4*time.Second)
	t.Logf("sticky on one gateway for %s: %d through, %d refused", stickyElapsed.Round(time.Millisecond), stickyThrough, stickyRefused)
	if hi := rps*stickyElapsed.Seconds() + burst + 1; float64(stickyThrough) > hi {
		t.Errorf("sticky got %d through, want at most R·W + B = %.0f", stickyThrough, hi)
	}
	if lo := 0.75 * rps * stickyElapsed.Seconds(); float64(stickyThrough) < lo && stickyRefused > 0 {
		t.Errorf("sticky got %d through (%d refused), want about R·W = %.0f: the limit must not be divided among gateways",
			stickyThrough, stickyRefused, rps*stickyElapsed.Seconds())
	}

	// The figures of any gateway are the fleet's: every 429 the client saw.
	wantLimited := uint64(refused + stickyRefused)
	var per map[string]uint64
	if !testenv.Wait(30*time.Second, func() bool {
		var sum uint64
		var ok bool
		sum, per, ok = gws[1].perUserLimited(t, op)
		return ok && sum == wantLimited && len(per) == 3
	}) {
		sum, per, _ := gws[1].perUserLimited(t, op)
		t.Fatalf("fleet perUser/limited = %d %v, want %d over 3 gateways", sum, per, wantLimited)
	}

	// A gateway killed with -9 drops out of the others' sum (its hash
	// expires; nobody removes it).
	dead := gws[2]
	if err := dead.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-dead.done
	killed := time.Now()
	want := wantLimited - per[dead.id]
	if !testenv.Wait(30*time.Second, func() bool {
		sum, p, ok := gws[0].perUserLimited(t, op)
		_, still := p[dead.id]
		return ok && !still && sum == want && len(p) == 2
	}) {
		sum, p, _ := gws[0].perUserLimited(t, op)
		t.Fatalf("after killing %s: perUser/limited = %d %v, want %d without it", dead.id, sum, p, want)
	}
	t.Logf("%s dropped out of the figures %s after the kill", dead.id, time.Since(killed).Round(100*time.Millisecond))
}
