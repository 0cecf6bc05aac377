package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/admission"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/loadtest"
)

// Options configure Run.
type Options struct {
	Exe        string        // the flashsale binary (`server` is run from it)
	Out        string        // directory for wrk reports, scripts, server logs and http.txt
	Wrk        string        // wrk binary; default "wrk"
	Duration   time.Duration // of every wrk run and idle window; default 10s
	Rounds     int           // default 3
	Threads    int           // wrk -t; default 2
	Conns      int           // wrk -c; default 256
	Users      int           // distinct in-stock shoppers minted per round; default 250,000
	GOMAXPROCS int           // of the server processes; default 2
	// CPUProfile, when set, records a CPU profile of the gateway during
	// every gateway run (Out/cpu-<scenario>-<round>.pprof, from its admin
	// port's /debug/pprof/profile).
	CPUProfile bool
	Progress   io.Writer // one line per run; nil: discard
}

func (o Options) withDefaults() Options {
	if o.Wrk == "" {
		o.Wrk = "wrk"
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Threads <= 0 {
		o.Threads = 2
	}
	if o.Conns <= 0 {
		o.Conns = 256
	}
	if o.Users <= 0 {
		o.Users = 250_000
	}
	// A round's cold shoppers are users round×10M + 0..Users, its warm
	// ones round×10M + 5M + 0..warmUsers.
	o.Users = min(o.Users, 5_000_000)
	if o.GOMAXPROCS <= 0 {
		o.GOMAXPROCS = 2
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// Scenario names.
const (
	Baseline    = "baseline"
	SoldOut     = "sold-out"
	NoAdmission = "no-admission"
	RateLimit   = "rate-limited"
	InStock     = "in-stock" // cold: every access token new to the gateway
	InStockWarm = "in-stock-warm"
	Idle        = "idle"
)

// warmUsers bounds the warm in-stock shoppers of a round: the gateway's
// token cache (wiring's TokenCacheSize, 1<<18 in 64 shards, a shard
// cleared when full) must hold all of them at once with room to spare.
const warmUsers = 200_000

// Sample is one measured run.
type Sample struct {
	Scenario string
	Round    int
	Wrk      WrkResult
	// RedisCommands is the change of total_commands_processed of the
	// gateway's Redis across the run (background loops included).
	RedisCommands int64
	// Codes counts the gateway's purchase answers by status code during
	// the run (from its /metrics).
	Codes   map[string]int64
	LoadAvg string // /proc/loadavg at the end of the run
	// PrevBaseline is the req/s of the last baseline run before this one
	// (the same round), for a ratio less exposed to drifting load.
	PrevBaseline float64
	// ServerCPU is the CPU the serving process (the baseline's or the
	// gateway's, not its Redis or PostgreSQL) used during the run, WrkCPU
	// wrk's: a request's price on these shared cores, which the req/s
	// ratio mixes with the client's.
	ServerCPU, WrkCPU time.Duration
}

// serverUs and wrkUs are the run's CPU per request in µs (0: no request).
func (s Sample) serverUs() float64 { return perRequestUs(s.ServerCPU, s.Wrk.Requests) }
func (s Sample) wrkUs() float64    { return perRequestUs(s.WrkCPU, s.Wrk.Requests) }

func perRequestUs(d time.Duration, reqs int64) float64 {
	if reqs <= 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1000 / float64(reqs)
}

// child is a running `flashsale-bench server`.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	info ServerInfo
}

func startServer(ctx context.Context, o Options, logPath string, args ...string) (*child, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child keeps its own descriptor
	cmd := exec.Command(o.Exe, append([]string{"server"}, args...)...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(o.GOMAXPROCS))
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewReader(outp)}
	type res struct {
		line string
		err  error
	}
	ch := make(chan res, 1)
	go func() { l, err := c.out.ReadString('\n'); ch <- res{l, err} }()
	select {
	case r := <-ch:
		if r.err == nil {
			r.err = json.Unmarshal([]byte(r.line), &c.info)
		}
		if r.err != nil {
			c.stop()
			return nil, fmt.Errorf("bench server %v did not start (log %s): %w", args, logPath, r.err)
		}
	case <-time.After(2 * time.Minute):
		c.stop()
		return nil, fmt.Errorf("bench server %v: not ready within 2m (log %s)", args, logPath)
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
	return c, nil
}

// command sends one command line and reads the one-line answer.
func (c *child) command(line string) error {
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		return err
	}
	ans, err := c.out.ReadString('\n')
	if err != nil {
		return err
	}
	if ans = strings.TrimSpace(ans); ans != "ok" {
		return fmt.Errorf("bench server: %s", ans)
	}
	return nil
}

// stop closes the server's stdin (it shuts down on EOF) and waits.
func (c *child) stop() {
	_ = c.in.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// Run starts the baseline and gateway servers, prepares the scenarios and
// runs Rounds rounds of: baseline, sold-out, no-admission, baseline,
// rate-limited, in-stock, idle window. It writes every wrk report and
// http.txt (the summary) to Out and returns the samples.
func Run(ctx context.Context, o Options) ([]Sample, error) {
	o = o.withDefaults()
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	secretB := make([]byte, 24)
	if _, err := rand.Read(secretB); err != nil {
		return nil, err
	}
	secret := hex.EncodeToString(secretB)

	base, err := startServer(ctx, o, filepath.Join(o.Out, "server-baseline.log"), "--mode", ModeBaseline)
	if err != nil {
		return nil, err
	}
	defer base.stop()
	gw, err := startServer(ctx, o, filepath.Join(o.Out, "server-gateway.log"), "--mode", ModeGateway, "--jwt-secret", secret)
	if err != nil {
		return nil, err
	}
	defer gw.stop()
	fmt.Fprintf(o.Progress, "baseline server %s (pid %d), gateway %s (pid %d), redis %s\n",
		base.info.URL, base.info.PID, gw.info.URL, gw.info.PID, gw.info.RedisURL)

	// The bench's server starts its own redis-server; the driver connects
	// to it the way every binary does (redisconn).
	rdb, err := redisconn.New(redisconn.Config{URL: gw.info.RedisURL})
	if err != nil {
		return nil, err
	}
	defer rdb.Close()

	mint := newMinter(secret, gw.info.SaleID)
	tmp, err := os.MkdirTemp("", "flashsale-bench-tokens-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	// Sell the one unit of the sold-out item, then one more request sets
	// the gateway's local sold-out flag.
	info := gw.info
	for i, want := range []int{http.StatusAccepted, http.StatusGone} {
		user := int64(1 + i)
		code, body, err := mint.purchase(ctx, info.URL, info.SoldOutItem, user)
		if err != nil {
			return nil, err
		}
		if code != want {
			return nil, fmt.Errorf("sell-out: user %d got %d %s, want %d", user, code, body, want)
		}
	}

	path := func(item int64) string { return fmt.Sprintf("/api/flash-sales/items/%d/purchase", item) }
	soldOutLua := filepath.Join(o.Out, "sold-out.lua")
	noAdmLua := filepath.Join(o.Out, "no-admission.lua")
	rateLua := filepath.Join(o.Out, "rate-limited.lua")
	inStockLua := filepath.Join(o.Out, "in-stock.lua")
	for _, f := range []struct {
		path string
		body string
	}{
		{soldOutLua, mint.staticScript(3, true)},
		{noAdmLua, mint.staticScript(4, false)},
		{rateLua, mint.staticScript(5, true)},
		{inStockLua, strings.ReplaceAll(inStockScript, "NTHREADS", strconv.Itoa(o.Threads))},
	} {
		if err := os.WriteFile(f.path, []byte(f.body), 0o644); err != nil {
			return nil, err
		}
	}

	var samples []Sample
	run := func(round int, scenario, url, script string, args ...string) error {
		before, err := redisconn.Commands(ctx, rdb)
		if err != nil {
			return err
		}
		codes0, err := purchaseCodes(ctx, info.AdminURL)
		if err != nil {
			return err
		}
		var res WrkResult
		pid := gw.info.PID
		if scenario == Baseline {
			pid = base.info.PID
		}
		cpu0, err := loadtest.ProcessCPU(pid)
		if err != nil {
			return err
		}
		var wrkCPU time.Duration
		var profDone chan struct{}
		if o.CPUProfile && scenario != Baseline && scenario != Idle {
			profDone = make(chan struct{})
			go func() {
				defer close(profDone)
				secs := max(1, int(o.Duration.Seconds())-1)
				file := filepath.Join(o.Out, fmt.Sprintf("cpu-%s-%d.pprof", scenario, round))
				if err := fetchProfile(ctx, info.AdminURL, secs, file); err != nil {
					fmt.Fprintf(o.Progress, "cpu profile %s: %v\n", scenario, err)
				}
			}()
		}
		if scenario == Idle {
			select {
			case <-time.After(o.Duration):
			case <-ctx.Done():
				return ctx.Err()
			}
		} else {
			wargs := []string{"-t", strconv.Itoa(o.Threads), "-c", strconv.Itoa(o.Conns),
				"-d", strconv.Itoa(int(o.Duration.Seconds())) + "s", "--latency", "-s", script, url}
			if len(args) > 0 {
				wargs = append(append(wargs, "--"), args...)
			}
			cmd := exec.CommandContext(ctx, o.Wrk, wargs...)
			out, err := cmd.CombinedOutput()
			if cmd.ProcessState != nil {
				wrkCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			}
			report := fmt.Sprintf("$ %s %s\n%s", o.Wrk, strings.Join(wargs, " "), out)
			_ = os.WriteFile(filepath.Join(o.Out, fmt.Sprintf("wrk-%s-%d.txt", scenario, round)), []byte(report), 0o644)
			if err != nil {
				return fmt.Errorf("wrk %s: %w\n%s", scenario, err, out)
			}
			if res, err = ParseWrk(string(out)); err != nil {
				return err
			}
		}
		cpu1, err := loadtest.ProcessCPU(pid)
		if err != nil {
			return err
		}
		if profDone != nil {
			<-profDone
		}
		after, err := redisconn.Commands(ctx, rdb)
		if err != nil {
			return err
		}
		codes1, err := purchaseCodes(ctx, info.AdminURL)
		if err != nil {
			return err
		}
		for k, v := range codes0 {
			codes1[k] -= v
			if codes1[k] == 0 {
				delete(codes1, k)
			}
		}
		if scenario == Baseline {
			codes1 = nil // the gateway did not serve it
		}
		s := Sample{Scenario: scenario, Round: round, Wrk: res, RedisCommands: after - before - 1, Codes: codes1, LoadAvg: loadAvg(),
			ServerCPU: cpu1 - cpu0, WrkCPU: wrkCPU}
		for i := len(samples) - 1; i >= 0; i-- {
			if samples[i].Scenario == Baseline {
				s.PrevBaseline = samples[i].Wrk.RPS
				break
			}
		}
		samples = append(samples, s)
		fmt.Fprintf(o.Progress, "round %d %-13s %9.0f req/s  server %5.2f µs/req  wrk %5.2f µs/req  redis cmds %7d  codes %v  non-2xx %d  sockerr %q  load %s\n",
			round, scenario, res.RPS, s.serverUs(), s.wrkUs(), s.RedisCommands, codeString(s.Codes), res.Non2xx, res.SocketErrors, s.LoadAvg)
		return nil
	}

	// Warm both servers up (connections, goroutine stacks, pools); not
	// recorded.
	for _, url := range []string{base.info.URL + path(info.SoldOutItem), info.URL + path(info.SoldOutItem)} {
		out, err := exec.CommandContext(ctx, o.Wrk, "-t", strconv.Itoa(o.Threads), "-c", strconv.Itoa(o.Conns), "-d", "2s", "-s", soldOutLua, url).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("wrk warm-up: %w\n%s", err, out)
		}
	}

	// The warm path: a real shopper's access token was verified when it
	// joined the queue, so its purchase finds the verdict in the gateway's
	// token cache. Before the warm run, each warm shopper's token goes
	// through a purchase without an admission token (verified, cached,
	// refused 403, nothing reserved), over the whole list at least three
	// times: a cache shard that fills and clears during the first pass
	// holds the rest after the second.
	prewarmLua := filepath.Join(o.Out, "prewarm.lua")
	prewarm := strings.Replace(inStockScript, `["X-Admission-Token"] = string.sub(line, tab + 1),`, "", 1)
	if prewarm == inStockScript {
		return nil, errors.New("bench: the prewarm script lost its admission header line")
	}
	if err := os.WriteFile(prewarmLua, []byte(strings.ReplaceAll(prewarm, "NTHREADS", strconv.Itoa(o.Threads))), 0o644); err != nil {
		return nil, err
	}
	// One wrk run must make the three passes (each run starts at the
	// list's top): a run too short for them is followed by one long
	// enough at the rate it saw, with a fifth to spare.
	warmTokens := func(file string, n int) error {
		secs := 10
		for range 3 {
			out, err := exec.CommandContext(ctx, o.Wrk, "-t", strconv.Itoa(o.Threads), "-c", strconv.Itoa(o.Conns), "-d", strconv.Itoa(secs)+"s",
				"-s", prewarmLua, info.URL+path(info.InStockItem), "--", file).CombinedOutput()
			if err != nil {
				return fmt.Errorf("wrk prewarm: %w\n%s", err, out)
			}
			res, err := ParseWrk(string(out))
			if err != nil {
				return err
			}
			if res.Requests >= 3*int64(n) {
				return nil
			}
			secs = int(float64(secs)*1.2*float64(3*n)/float64(max(res.Requests, 1))) + 1
			if secs > 120 {
				return fmt.Errorf("bench: prewarm of %d tokens would take %d s (%d requests in the last run)", n, secs, res.Requests)
			}
		}
		return fmt.Errorf("bench: prewarm of %d tokens never reached 3 passes", n)
	}
	nWarm := min(o.Users, warmUsers)

	for round := 1; round <= o.Rounds; round++ {
		tokens := filepath.Join(tmp, fmt.Sprintf("in-stock-%d.txt", round))
		if err := mint.inStockFile(tokens, int64(round)*10_000_000, o.Users); err != nil {
			return samples, err
		}
		warm := filepath.Join(tmp, fmt.Sprintf("in-stock-warm-%d.txt", round))
		if err := mint.inStockFile(warm, int64(round)*10_000_000+5_000_000, nWarm); err != nil {
			return samples, err
		}
		steps := []func() error{
			func() error { return run(round, Baseline, base.info.URL+path(info.SoldOutItem), soldOutLua) },
			func() error { return run(round, SoldOut, info.URL+path(info.SoldOutItem), soldOutLua) },
			func() error { return run(round, NoAdmission, info.URL+path(info.InStockItem), noAdmLua) },
			func() error { return run(round, Baseline, base.info.URL+path(info.SoldOutItem), soldOutLua) },
			func() error {
				if err := gw.command("defense " + oneLine(RateLimited)); err != nil {
					return err
				}
				err := run(round, RateLimit, info.URL+path(info.InStockItem), rateLua)
				return errors.Join(err, gw.command("defense "+oneLine(Permissive)))
			},
			func() error { return run(round, InStock, info.URL+path(info.InStockItem), inStockLua, tokens) },
			func() error {
				if err := warmTokens(warm, nWarm); err != nil {
					return err
				}
				return run(round, InStockWarm, info.URL+path(info.InStockItem), inStockLua, warm)
			},
			func() error { return run(round, Idle, "", "") },
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return samples, err
			}
		}
		_ = os.Remove(tokens)
		_ = os.Remove(warm)
	}
	if cs, err := rdb.Info(ctx, "commandstats").Result(); err == nil {
		_ = os.WriteFile(filepath.Join(o.Out, "redis-commandstats.txt"), []byte(cs), 0o644)
	}
	summary := Summarize(samples, o)
	if err := os.WriteFile(filepath.Join(o.Out, "http.txt"), []byte(summary), 0o644); err != nil {
		return samples, err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "http-medians.txt"), []byte(Medians(samples)), 0o644); err != nil {
		return samples, err
	}
	fmt.Fprint(o.Progress, summary)
	return samples, nil
}

// fetchProfile writes a CPU profile of secs seconds from the admin server
// at adminURL to file.
func fetchProfile(ctx context.Context, adminURL string, secs int, file string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", adminURL, secs), nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET profile: %s", res.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, res.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

var reCode = regexp.MustCompile(`^flashsale_gateway_requests_total\{(.*)\}\s+([0-9.e+]+)$`)

// purchaseCodes scrapes the gateway's purchase answers by status code.
func purchaseCodes(ctx context.Context, adminURL string) (map[string]int64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", adminURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer res.Body.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := reCode.FindStringSubmatch(sc.Text())
		if m == nil || !strings.Contains(m[1], `route="purchase"`) {
			continue
		}
		code := ""
		for _, l := range strings.Split(m[1], ",") {
			if v, ok := strings.CutPrefix(l, `code="`); ok {
				code = strings.TrimSuffix(v, `"`)
			}
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		out[code] += int64(v)
	}
	return out, sc.Err()
}

func codeString(m map[string]int64) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%d", k, m[k])
	}
	return b.String()
}

// minter mints access and admission tokens as the gateway's configuration
// expects them.
type minter struct {
	secret string
	saleID int64
	signer *admission.Signer
	exp    time.Time
}

func newMinter(secret string, saleID int64) *minter {
	cfg := wiring.Config{JWTSecret: secret}
	signer, err := admission.NewSigner(admission.Key{ID: 1, Secret: cfg.AdmissionSecret()})
	if err != nil {
		panic(err) // a fixed, valid key
	}
	return &minter{secret: secret, saleID: saleID, signer: signer, exp: time.Now().Add(2 * time.Hour)}
}

func (m *minter) tokens(user int64) (access, adm string) {
	access, err := auth.Mint(m.secret, user, false, 2*time.Hour, time.Now())
	if err != nil {
		panic(err) // HS256 with a non-empty secret does not fail
	}
	return access, m.signer.Sign(flashsale.Admission{UserID: user, SaleID: m.saleID, ExpiresAt: m.exp})
}

func (m *minter) purchase(ctx context.Context, baseURL string, item, user int64) (int, string, error) {
	access, adm := m.tokens(user)
	req, err := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("%s/api/flash-sales/items/%d/purchase", baseURL, item), nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+access)
	req.Header.Set("X-Admission-Token", adm)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), nil
}

// staticScript is a wrk script sending one fixed request (wrk builds it
// once): POST with the user's access token and, with adm, its admission
// token.
func (m *minter) staticScript(user int64, adm bool) string {
	access, at := m.tokens(user)
	s := fmt.Sprintf("-- user %d, sale %d\nwrk.method = \"POST\"\nwrk.headers[\"Authorization\"] = \"Bearer %s\"\n", user, m.saleID, access)
	if adm {
		s += fmt.Sprintf("wrk.headers[\"X-Admission-Token\"] = %q\n", at)
	}
	return s
}

// inStockFile writes n lines "accessToken<TAB>admissionToken" for users
// first+1 … first+n.
func (m *minter) inStockFile(path string, first int64, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	for i := 1; i <= n; i++ {
		access, adm := m.tokens(first + int64(i))
		w.WriteString(access)
		w.WriteByte('\t')
		w.WriteString(adm)
		w.WriteByte('\n')
	}
	return errors.Join(w.Flush(), f.Close())
}

// inStockScript gives each wrk thread every k-th line of the token file
// (its first argument) and sends each pre-built request once, in order;
// after the last one it starts over (those answers are 409).
const inStockScript = `-- in-stock purchases: one distinct shopper per request
local counter = 0
function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
end

local reqs = {}
local n, i = 0, 0

function init(args)
  local k = 0
  for line in io.lines(args[1]) do
    if k % NTHREADS == tid then
      local tab = string.find(line, "\t", 1, true)
      n = n + 1
      reqs[n] = wrk.format("POST", wrk.path, {
        ["Authorization"] = "Bearer " .. string.sub(line, 1, tab - 1),
        ["X-Admission-Token"] = string.sub(line, tab + 1),
      })
    end
    k = k + 1
  end
end

function request()
  i = i + 1
  if i > n then i = 1 end
  return reqs[i]
end
`

// goals are the ratios to the bare fiber baseline a scenario must reach:
// a refusal costs about what fiber's own answer does, and a purchase
// whose token is new (the cold path) at least 30% of it.
var goals = map[string]float64{SoldOut: 0.95, NoAdmission: 0.95, RateLimit: 0.95, InStock: 0.30}

// Summarize renders the samples as the text table of http.txt.
func Summarize(samples []Sample, o Options) string {
	o = o.withDefaults()
	by := map[string][]Sample{}
	for _, s := range samples {
		by[s.Scenario] = append(by[s.Scenario], s)
	}
	med := median
	rps := func(name string) []float64 {
		var out []float64
		for _, s := range by[name] {
			out = append(out, s.Wrk.RPS)
		}
		return out
	}
	cmds := func(name string) []float64 {
		var out []float64
		for _, s := range by[name] {
			out = append(out, float64(s.RedisCommands))
		}
		return out
	}
	baseMed := med(rps(Baseline))
	idleMed := med(cmds(Idle))
	var b strings.Builder
	fmt.Fprintf(&b, "\nHTTP benchmarks: wrk -t%d -c%d -d%s, %d rounds, servers at GOMAXPROCS=%d; wrk, the servers, redis-server and PostgreSQL share this machine's cores.\n",
		o.Threads, o.Conns, o.Duration, o.Rounds, o.GOMAXPROCS)
	fmt.Fprintf(&b, "Redis commands of an idle window of %s (background loops): median %.0f\n\n", o.Duration, idleMed)
	fmt.Fprintf(&b, "%-13s %-34s %9s %7s %7s %-6s %10s %9s %-28s %s\n", "scenario", "req/s per run", "median", "ratio", "paired", "goal", "redis-idle", "cmds/req", "gateway answers (all runs)", "load avg at end of runs")
	for _, name := range []string{Baseline, SoldOut, NoAdmission, RateLimit, InStock, InStockWarm} {
		ss := by[name]
		if len(ss) == 0 {
			continue
		}
		var runs, loads []string
		var reqs int64
		codes := map[string]int64{}
		for _, s := range ss {
			runs = append(runs, fmt.Sprintf("%.0f", s.Wrk.RPS))
			loads = append(loads, s.LoadAvg)
			reqs += s.Wrk.Requests
			for k, v := range s.Codes {
				codes[k] += v
			}
		}
		m := med(rps(name))
		ratio := m / baseMed
		var pairs []float64
		for _, s := range ss {
			if s.PrevBaseline > 0 {
				pairs = append(pairs, s.Wrk.RPS/s.PrevBaseline)
			}
		}
		paired := "-"
		if name != Baseline && len(pairs) > 0 {
			paired = fmt.Sprintf("%.1f%%", 100*med(pairs))
		}
		goal := "-"
		if min, ok := goals[name]; ok {
			goal = "met"
			if ratio < min {
				goal = "missed"
			}
		}
		extra := med(cmds(name)) - idleMed
		perReq := "-"
		if name != Baseline && reqs > 0 {
			var total float64
			for _, s := range ss {
				total += float64(s.RedisCommands) - idleMed
			}
			perReq = fmt.Sprintf("%.4f", total/float64(reqs))
		}
		redisCol := fmt.Sprintf("%.0f", extra)
		if name == Baseline {
			redisCol = "-"
		}
		fmt.Fprintf(&b, "%-13s %-34s %9.0f %6.1f%% %7s %-6s %10s %9s %-28s %s\n", name, strings.Join(runs, " "), m, 100*ratio, paired, goal,
			redisCol, perReq, codeString(codes), strings.Join(loads, " | "))
	}
	fmt.Fprintf(&b, "\nratio = median req/s / median baseline req/s (%.0f); paired = median over rounds of req/s / the baseline run just before it in its round; goal (refusals >= 95%%, in-stock cold >= 30%%) is judged on ratio; redis-idle = median Redis commands of the scenario's runs minus the idle median; cmds/req = (sum over runs of commands minus idle) / requests.\n", baseMed)

	// The price of a request on each side, which the ratio mixes: on
	// these shared cores a server that costs more CPU a request leaves
	// less to wrk as well.
	us := func(name string, f func(Sample) float64) []float64 {
		var out []float64
		for _, s := range by[name] {
			if s.Wrk.Requests > 0 {
				out = append(out, f(s))
			}
		}
		return out
	}
	baseUs := med(us(Baseline, Sample.serverUs))
	fmt.Fprintf(&b, "\n%-13s %-40s %9s %9s %13s\n", "scenario", "server CPU µs/req per run", "median", "wrk µs", "vs baseline")
	for _, name := range []string{Baseline, SoldOut, NoAdmission, RateLimit, InStock, InStockWarm} {
		server := us(name, Sample.serverUs)
		if len(server) == 0 {
			continue
		}
		var runs []string
		for _, v := range server {
			runs = append(runs, fmt.Sprintf("%.2f", v))
		}
		m := med(server)
		vs := "-"
		if m > 0 && baseUs > 0 {
			vs = fmt.Sprintf("%.1f%%", 100*baseUs/m)
		}
		fmt.Fprintf(&b, "%-13s %-40s %9.2f %9.2f %13s\n", name, strings.Join(runs, " "), m, med(us(name, Sample.wrkUs)), vs)
	}
	b.WriteString("\nserver CPU = utime + stime of the serving process (/proc/<pid>/stat; the gateway's Redis and PostgreSQL not in it) over the run ÷ wrk's requests; wrk µs = wrk's own CPU ÷ its requests; vs baseline = the baseline's median server µs ÷ the scenario's: the share of fiber's price a request of it costs in the server alone.\n")
	return b.String()
}

// median is the middle of xs (the mean of the two middle ones for an
// even count; 0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// Medians renders "scenario median-req/s" lines (http-medians.txt, read by
// scripts/bench.sh).
func Medians(samples []Sample) string {
	by := map[string][]float64{}
	var order []string
	for _, s := range samples {
		if _, ok := by[s.Scenario]; !ok {
			order = append(order, s.Scenario)
		}
		if s.Scenario == Idle {
			by[s.Scenario] = append(by[s.Scenario], float64(s.RedisCommands))
			continue
		}
		by[s.Scenario] = append(by[s.Scenario], s.Wrk.RPS)
	}
	var b strings.Builder
	for _, name := range order {
		fmt.Fprintf(&b, "%s %.0f\n", name, median(by[name]))
	}
	return b.String()
}
