package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/flashsale/flashsale/internal/benchhttp"
)

// cmdBench is the hidden `bench` command of scripts/bench.sh:
//
//	flashsale bench http [flags]     run the HTTP benchmarks (wrk) and write out/bench
//	flashsale bench server [flags]   one benchmark server (started by `bench http`)
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: flashsale bench http|server [flags]")
		return errUsage
	}
	switch args[0] {
	case "server":
		return cmdBenchServer(ctx, args[1:], stdout, stderr)
	case "http":
		return cmdBenchHTTP(ctx, args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "flashsale bench: unknown subcommand %q (want http or server)\n", args[0])
		return errUsage
	}
}

func cmdBenchServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o benchhttp.ServerOptions
	fs := newFlagSet("bench server", stderr)
	fs.StringVar(&o.Mode, "mode", benchhttp.ModeGateway, "baseline (bare fiber 410) or gateway (app.Start on local Redis and PostgreSQL)")
	fs.StringVar(&o.Addr, "addr", "127.0.0.1:0", "public listener")
	fs.StringVar(&o.Dir, "dir", "", "scratch directory for Redis and PostgreSQL (default: a temporary one)")
	fs.StringVar(&o.JWTSecret, "jwt-secret", os.Getenv("FLASHSALE_JWT_SECRET"), "access-token secret (gateway mode)")
	logLevel := fs.String("log-level", "warn", "server log level")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return benchhttp.Serve(ctx, o, os.Stdin, stdout, newLogger("text", *logLevel, stderr))
}

func cmdBenchHTTP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o benchhttp.Options
	fs := newFlagSet("bench http", stderr)
	fs.StringVar(&o.Out, "out", "out/bench", "directory for wrk reports, scripts, server logs and http.txt")
	fs.StringVar(&o.Wrk, "wrk", "wrk", "wrk binary")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "every wrk run and the idle window")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds of baseline, sold-out, no-admission, baseline, rate-limited, in-stock, idle")
	fs.IntVar(&o.Threads, "threads", 2, "wrk -t")
	fs.IntVar(&o.Conns, "conns", 256, "wrk -c")
	fs.IntVar(&o.Users, "users", 250_000, "distinct in-stock shoppers per round")
	fs.BoolVar(&o.CPUProfile, "cpuprofile", false, "record a CPU profile of the gateway in every gateway run (OUT/cpu-*.pprof)")
	fs.IntVar(&o.GOMAXPROCS, "gomaxprocs", 2, "GOMAXPROCS of the server processes")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	o.Exe, o.Progress = exe, stdout
	_, err = benchhttp.Run(ctx, o)
	return err
}
