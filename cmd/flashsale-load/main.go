// Command flashsale-load is the load harness: it drives a running flashsale
// stack from outside, through its public interface, with a scenario of
// simulated shoppers, checks the invariants and writes a JSON and an HTML
// report (the loadtest package). It is a binary of its own so that the
// production binary, cmd/flashsale, does not carry it (TestNotShipped).
// Large runs fork worker processes of this same binary (loadtest.WorkerArg).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/loadtest"
	"github.com/flashsale/flashsale/waitroom"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if len(os.Args) > 1 && os.Args[1] == loadtest.WorkerArg {
		// A forked load-generator worker: it reads its share from stdin.
		err := loadtest.RunWorker(ctx)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "flashsale-load worker:", err)
			os.Exit(1)
		}
		return
	}
	err := cmdLoadtest(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "flashsale-load:", err)
		os.Exit(1)
	}
}

// errUsage marks an error already explained to the user by the flag set.
var errUsage = errors.New("usage")

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	return nil
}

func splitComma(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

type urlList []string

func (u *urlList) String() string     { return strings.Join(*u, ",") }
func (u *urlList) Set(v string) error { *u = append(*u, splitComma(v)...); return nil }

func cmdLoadtest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("flashsale-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "smoke", "preset: "+strings.Join(loadtest.ScenarioNames(), ", "))
	var urls urlList
	fs.Var(&urls, "url", "public address of a gateway (repeat or comma-separate to spread shoppers over several); default http://127.0.0.1:8080")
	adminURL := fs.String("admin-url", "", "admin address: wait for /readyz first")
	// The defaults are the server's settings (wiring's spec), so a run on
	// the stack's host needs no flags for them.
	env := wiring.Defaults()
	if err := env.LoadEnv(); err != nil {
		return err
	}
	secret := fs.String("secret", env.JWTSecret, "JWT secret to mint tokens (default $FLASHSALE_JWT_SECRET)")
	sale := fs.Int64("sale", 0, "use this sale instead of creating one")
	shoppers := fs.Int("shoppers", -1, "simulated shoppers (default: the scenario's)")
	quantity := fs.Int("quantity", -1, "units of the created sale")
	items := fs.Int("items", -1, "items of the created sale")
	stockShards := fs.Int("stock-shards", 0, "stockShards of the created sale: each item's stock split over this many Redis hash slots (0: one)")
	allocation := fs.String("allocation", "", "allocation of the created sale: queue (a unit held for each shopper at their turn; the default) or race")
	claimWindow := fs.Duration("claim-window", 0, "claim window of the created sale in queue order, whole seconds (0: the default, 2m)")
	reaction := fs.Duration("reaction", 0, "a person's median time from the token buying to the click (log-normal, about 2x either way; 0: at once)")
	fastShare := fs.Float64("fast-share", 0, "fraction of shoppers who are fast clients and click the instant their token buys (with --reaction)")
	shadowShare := fs.Float64("shadow-share", 0, "fraction of shoppers whose token carries a risk claim of 0.99; the run turns the shadow queue on for them (riskAbove 0.9, and the identity rule with -duplicate-identities) and checks that none is admitted or buys")
	duplicates := fs.Float64("duplicate-identities", 0, "fraction of shoppers who are a second account of another shopper: every token carries an identity key (idk), these the other shopper's; the report checks one order per key")
	rate := fs.Int("rate", -1, "admission rate per second of the created sale")
	startsIn := fs.Duration("starts-in", 0, "the created sale opens this long after the start")
	transport := fs.String("transport", "", "ws or polling")
	pay := fs.Float64("pay", -1, "fraction of winners who pay")
	payAfter := fs.Duration("pay-after", -1, "a paying winner's think time before the pay click (each draws 50–150% of it; default: the scenario's)")
	linger := fs.Duration("linger", -1, "how long a shopper who saw SOLD_OUT without buying stays connected before leaving (each draws 50–150% of it; default: the scenario's)")
	preconnect := fs.Int("preconnect", -1, "keep-alive connections per process, source address and gateway opened 5 s before the opening (default: the scenario's)")
	flood := fs.Int("flood", -1, "hostile purchases without valid tokens")
	early := fs.Int("early", -1, "hostile clicks before opening")
	oneAddr := fs.Int("one-addr", -1, "shoppers sharing one source address")
	sourceAddrs := fs.Int("source-addrs", -1, fmt.Sprintf("spread client sockets over this many 127.0.0.x addresses (a gateway takes %d room connections per address unless FLASHSALE_WS_MAX_CONNS_PER_ADDR says otherwise: keep shoppers / (addresses × gateways) below it)", waitroom.DefaultMaxConnsPerIP))
	procs := fs.Int("processes", -1, "worker processes (to pass the per-process open-file limit)")
	duration := fs.Duration("duration", 0, "hard bound on the run")
	quiet := fs.Duration("quiet-timeout", 0, "how long to wait for conservation after the shoppers (default: 15s, at most a fifth of the duration); cover the server's FLASHSALE_RECONCILE_AFTER when publishes may fail")
	dbURL := fs.String("database-url", env.DatabaseURL, "PostgreSQL URL for the invariant checks (optional)")
	redisURL := fs.String("redis-url", env.RedisURL, "Redis URL for the command counter (optional)")
	redisCluster := fs.String("redis-cluster", strings.Join(env.RedisCluster, ","), "Redis Cluster seeds for the command counter, summed over every master (optional)")
	keepWaiting := fs.Bool("keep-waiting", false, "shoppers who saw SOLD_OUT stay in the room until the run ends, or until the sale has been sold out with nothing on its way back for -sold-out-quiet, so stock that comes back sells again (default: the scenario's)")
	soldOutQuiet := fs.Duration("sold-out-quiet", 0, "with -keep-waiting: how long the sale stays sold out, nothing pending, before the shoppers leave and stranded units are judged (default 10s)")
	untilPaid := fs.Bool("until-paid", false, "end the shopper phase once paid = quantity (default: the scenario's)")
	joinSpread := fs.Duration("join-spread", 0, "spread the shoppers' joins over this long (default: 80% of the time before opening)")
	pollInterval := fs.Duration("poll-interval", 0, "polling transport: time between status reads (default 1s)")
	seed := fs.Uint64("seed", 0, "seed of the shoppers' draws (who pays, item choice, think times, backoff); default 1")
	jsonOut := fs.String("json", "loadtest-report.json", "JSON report file (empty: none); its \"summary\" (oversold, acknowledgedLost, acknowledgedRejected, strandedUnits, http5xx, networkErrors), \"ledger\" (every order and how it ended) and \"timeline\" (admissionsMs, reservationsMs) are described in the loadtest package doc")
	htmlOut := fs.String("html", "loadtest-report.html", "HTML report file (empty: none)")
	serverPIDs := fs.String("server-pids", "", "server processes whose CPU-seconds the report's \"cpu\" section counts, as role=pid,… (gateway=812,gateway=815,redis=640,postgres=700: a PostgreSQL postmaster counts its backends, live and exited); the load tool and its workers count as \"load\" in any case")
	profileDir := fs.String("profile-dir", "", "write CPU profiles of the opening here: of every --profile-urls server and of each load worker process (loadtest-worker-<k>.pprof)")
	profileURLs := fs.String("profile-urls", "", "servers to profile at the opening, as name=admin-url,… (gateway1=http://127.0.0.1:19081): each one's /debug/pprof/profile lands in --profile-dir as <name>.pprof")
	workerProfileDir := fs.String("worker-cpuprofile", "", "write a CPU profile of each load worker process's whole run here (loadtest-worker-<pid>.pprof), to see what the load generator itself costs")
	profileSeconds := fs.Int("profile-seconds", loadtest.DefaultProfileSeconds, fmt.Sprintf("length of the opening profiles, from %v before the opening", loadtest.DefaultProfileBefore))
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadtest.Scenario(*scenario)
	if err != nil {
		return err
	}
	if len(urls) == 0 {
		urls = urlList{"http://127.0.0.1:8080"}
	}
	cfg.BaseURL, cfg.BaseURLs = urls[0], urls[1:]
	cfg.AdminURL, cfg.JWTSecret, cfg.SaleID = *adminURL, *secret, *sale
	cfg.DatabaseURL = *dbURL
	// The counter connects like the server (redisconn): a URL, a cluster
	// or Sentinel, with the same password and CA settings.
	cfg.Redis.URL, cfg.Redis.Cluster = *redisURL, splitComma(*redisCluster)
	cfg.Redis.Sentinels, cfg.Redis.Master = env.RedisSentinels, env.RedisMaster
	cfg.Redis.Password, cfg.Redis.TLSCA = env.RedisPassword, env.RedisTLSCA
	cfg.Progress = stderr
	setInt := func(dst *int, v int) {
		if v >= 0 {
			*dst = v
		}
	}
	setInt(&cfg.Shoppers, *shoppers)
	setInt(&cfg.Quantity, *quantity)
	cfg.StockShards = *stockShards
	cfg.Allocation, cfg.ClaimWindow = *allocation, *claimWindow
	cfg.Reaction, cfg.FastShare = *reaction, *fastShare
	cfg.DuplicateIdentities = *duplicates
	cfg.ShadowShare = *shadowShare
	setInt(&cfg.Items, *items)
	setInt(&cfg.AdmissionRate, *rate)
	setInt(&cfg.Hostile.PurchaseFlood, *flood)
	setInt(&cfg.Hostile.EarlyClicks, *early)
	setInt(&cfg.Hostile.OneAddrUsers, *oneAddr)
	setInt(&cfg.SourceAddrs, *sourceAddrs)
	setInt(&cfg.Processes, *procs)
	setInt(&cfg.Preconnect, *preconnect)
	if *payAfter >= 0 {
		cfg.PayAfter = *payAfter
	}
	if *linger >= 0 {
		cfg.Linger = *linger
	}
	if *startsIn > 0 {
		cfg.StartsIn = *startsIn
	}
	if *transport != "" {
		cfg.Transport = *transport
	}
	if *pay >= 0 {
		cfg.PayFraction = *pay
	}
	if *duration > 0 {
		cfg.Duration = *duration
	}
	if *quiet > 0 {
		cfg.QuietTimeout = *quiet
	}
	cfg.KeepWaiting = cfg.KeepWaiting || *keepWaiting
	if *soldOutQuiet > 0 {
		cfg.SoldOutQuiet = *soldOutQuiet
	}
	cfg.UntilPaid = cfg.UntilPaid || *untilPaid
	if *joinSpread > 0 {
		cfg.JoinSpread = *joinSpread
	}
	if *pollInterval > 0 {
		cfg.PollInterval = *pollInterval
	}
	if *seed > 0 {
		cfg.Seed = *seed
	}
	if cfg.JWTSecret == "" {
		return errors.New("no JWT secret: set FLASHSALE_JWT_SECRET or --secret")
	}
	if cfg.ServerPIDs, err = loadtest.ParseServerPIDs(*serverPIDs); err != nil {
		return err
	}
	if cfg.Profile.URLs, err = loadtest.ParseProfileURLs(*profileURLs); err != nil {
		return err
	}
	if len(cfg.Profile.URLs) > 0 && *profileDir == "" {
		return errors.New("--profile-urls needs --profile-dir")
	}
	cfg.Profile.Dir, cfg.Profile.Seconds = *profileDir, *profileSeconds
	cfg.WorkerCPUProfileDir = *workerProfileDir
	rep, runErr := loadtest.Run(ctx, cfg)
	if rep == nil {
		return runErr
	}
	if err := writeReport(*jsonOut, rep.WriteJSON); err != nil {
		return err
	}
	if err := writeReport(*htmlOut, rep.WriteHTML); err != nil {
		return err
	}
	if rep.CPU != nil {
		fmt.Fprint(stdout, "\n"+rep.CPU.Text())
	}
	fmt.Fprintf(stdout, "\nreports: %s %s\n", *jsonOut, *htmlOut)
	return runErr
}

func writeReport(path string, write func(io.Writer) error) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
