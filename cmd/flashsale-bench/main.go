// Command flashsale-bench runs the HTTP benchmarks of `make bench`
// (scripts/bench.sh). It is a binary of its own so that no benchmark code
// ships in the production binary, cmd/flashsale; TestLayout checks that.
//
//	flashsale-bench http [flags]     run the HTTP benchmarks (wrk) and write out/bench
//	flashsale-bench ws [flags]       WebSocket shoppers: the gateway against a bare coder/websocket server
//	flashsale-bench server [flags]   one benchmark server (started by `http`)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/flashsale/flashsale/internal/bench"
	"github.com/flashsale/flashsale/internal/wiring"
)

const usage = "usage: flashsale-bench http|ws|server [flags]"

func main() {
	wiring.RaiseFileLimit()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "server":
		err = cmdServer(ctx, args[1:], stdout, stderr)
	case "http":
		err = cmdHTTP(ctx, args[1:], stdout, stderr)
	case "ws":
		err = cmdWS(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "flashsale-bench: unknown command %q\n%s\n", args[0], usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "flashsale-bench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// newFlags is a flag set that exits on a bad flag (2) or -h (0), as a
// tool run by scripts/bench.sh may.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("flashsale-bench "+name, flag.ExitOnError)
	fs.SetOutput(stderr)
	return fs
}

func cmdServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o bench.ServerOptions
	fs := newFlags("server", stderr)
	fs.StringVar(&o.Mode, "mode", bench.ModeGateway, "baseline (bare fiber 410), ws-bare (bare coder/websocket join) or gateway (wiring.Start on local Redis and PostgreSQL)")
	fs.BoolVar(&o.QueueSale, "queue-sale", false, "gateway: also create a queue-order sale opening in six hours (its pre-queue, for ws)")
	fs.StringVar(&o.Addr, "addr", "127.0.0.1:0", "public listener")
	fs.StringVar(&o.Dir, "dir", "", "scratch directory for Redis and PostgreSQL (default: a temporary one)")
	env := wiring.Defaults()
	if err := env.LoadEnv(); err != nil {
		return err
	}
	fs.StringVar(&o.JWTSecret, "jwt-secret", env.JWTSecret, "access-token secret (gateway mode)")
	logLevel := fs.String("log-level", "warn", "server log level")
	_ = fs.Parse(args) // ExitOnError
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level %q: %w", *logLevel, err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	return bench.Serve(ctx, o, os.Stdin, stdout, logger)
}

// parseDriver parses a driver's flags, which take no arguments, and
// returns this binary's path: the driver runs its servers from it.
func parseDriver(fs *flag.FlagSet, args []string) (string, error) {
	_ = fs.Parse(args) // ExitOnError
	if fs.NArg() > 0 {
		return "", fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return os.Executable()
}

func cmdHTTP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o bench.Options
	fs := newFlags("http", stderr)
	fs.StringVar(&o.Out, "out", "out/bench", "directory for wrk reports, scripts, server logs and http.txt")
	fs.StringVar(&o.Wrk, "wrk", "wrk", "wrk binary")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "every wrk run and the idle window")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds of baseline, sold-out, no-admission, baseline, rate-limited, in-stock (cold), in-stock-warm, idle")
	fs.IntVar(&o.Threads, "threads", 2, "wrk -t")
	fs.IntVar(&o.Conns, "conns", 256, "wrk -c")
	fs.IntVar(&o.Users, "users", 250_000, "distinct cold in-stock shoppers per round (at most 5,000,000; the warm ones are min(this, 200,000))")
	fs.BoolVar(&o.CPUProfile, "cpuprofile", false, "record a CPU profile of the gateway in every gateway run (OUT/cpu-*.pprof)")
	fs.IntVar(&o.GOMAXPROCS, "gomaxprocs", 2, "GOMAXPROCS of the server processes")
	exe, err := parseDriver(fs, args)
	if err != nil {
		return err
	}
	o.Exe, o.Progress = exe, stdout
	_, err = bench.Run(ctx, o)
	return err
}

func cmdWS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o bench.WSOptions
	fs := newFlags("ws", stderr)
	fs.StringVar(&o.Out, "out", "out/bench", "directory for server logs and ws.txt")
	fs.IntVar(&o.Conns, "conns", 15_000, "WebSocket shoppers a run, all held at once")
	fs.Float64Var(&o.Rate, "rate", 375, "joins a second")
	fs.DurationVar(&o.Hold, "hold", 30*time.Second, "how long every socket is held before the clients close them")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds of ws-bare, gateway")
	fs.IntVar(&o.Sources, "sources", 100, "client addresses (127.0.1.1 ...)")
	fs.IntVar(&o.GOMAXPROCS, "gomaxprocs", 1, "GOMAXPROCS of the server processes")
	fs.IntVar(&o.ClientProcs, "client-procs", 1, "GOMAXPROCS of this process (the clients) during the runs")
	fs.BoolVar(&o.CPUProfile, "cpuprofile", false, "record CPU profiles of the gateway's joins and hold in every gateway run (OUT/ws-cpu-*.pprof)")
	exe, err := parseDriver(fs, args)
	if err != nil {
		return err
	}
	o.Exe, o.Progress = exe, stdout
	_, err = bench.RunWS(ctx, o)
	return err
}
