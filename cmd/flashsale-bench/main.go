// Command flashsale-bench runs the HTTP benchmarks of `make bench`
// (scripts/bench.sh). It is a binary of its own so that no benchmark code
// ships in the production binary, cmd/flashsale; TestLayout checks that.
//
//	flashsale-bench http [flags]     run the HTTP benchmarks (wrk) and write out/bench
//	flashsale-bench server [flags]   one benchmark server (started by `http`)
package main

import (
	"context"
	"errors"
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

const usage = "usage: flashsale-bench http|server [flags]"

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
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "flashsale-bench: unknown command %q\n%s\n", args[0], usage)
		return 2
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "flashsale-bench %s: %v\n", args[0], err)
		return 1
	}
}

// errUsage marks an error the flag set has already explained.
var errUsage = errors.New("usage")

func parse(fs *flag.FlagSet, args []string) error {
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

func cmdServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o bench.ServerOptions
	fs := flag.NewFlagSet("flashsale-bench server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Mode, "mode", bench.ModeGateway, "baseline (bare fiber 410) or gateway (wiring.Start on local Redis and PostgreSQL)")
	fs.StringVar(&o.Addr, "addr", "127.0.0.1:0", "public listener")
	fs.StringVar(&o.Dir, "dir", "", "scratch directory for Redis and PostgreSQL (default: a temporary one)")
	fs.StringVar(&o.JWTSecret, "jwt-secret", os.Getenv("FLASHSALE_JWT_SECRET"), "access-token secret (gateway mode)")
	logLevel := fs.String("log-level", "warn", "server log level")
	if err := parse(fs, args); err != nil {
		return err
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level %q: %w", *logLevel, err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	return bench.Serve(ctx, o, os.Stdin, stdout, logger)
}

func cmdHTTP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o bench.Options
	fs := flag.NewFlagSet("flashsale-bench http", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Out, "out", "out/bench", "directory for wrk reports, scripts, server logs and http.txt")
	fs.StringVar(&o.Wrk, "wrk", "wrk", "wrk binary")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "every wrk run and the idle window")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds of baseline, sold-out, no-admission, baseline, rate-limited, in-stock, idle")
	fs.IntVar(&o.Threads, "threads", 2, "wrk -t")
	fs.IntVar(&o.Conns, "conns", 256, "wrk -c")
	fs.IntVar(&o.Users, "users", 250_000, "distinct in-stock shoppers per round")
	fs.BoolVar(&o.CPUProfile, "cpuprofile", false, "record a CPU profile of the gateway in every gateway run (OUT/cpu-*.pprof)")
	fs.IntVar(&o.GOMAXPROCS, "gomaxprocs", 2, "GOMAXPROCS of the server processes")
	if err := parse(fs, args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	o.Exe, o.Progress = exe, stdout
	_, err = bench.Run(ctx, o)
	return err
}
