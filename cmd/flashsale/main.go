// Command flashsale runs the flash-sale system: every role in one process for
// development (`flashsale dev`), or one role per process in production
// (`gateway`, `writer`, `expiry`), plus tools (`migrate`, `config`,
// `token`, `verify-draw`). Configuration is environment first
// (FLASHSALE_*, the spec in internal/wiring/settings.go), flags override. The load harness is a binary of its own, cmd/flashsale-load.
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

	"github.com/flashsale/flashsale/internal/wiring"
)

const usage = `flashsale — a flash-sale system (edge gateway, waiting room, Redis reservation, Kafka writer, expiry)

usage: flashsale <command> [flags]

commands:
  dev [--demo]        every role in one process, starting local Redis, PostgreSQL and an embedded Kafka as needed
  gateway             the edge: HTTP API, waiting room, purchase service (stateless; run N of them)
  writer              the Kafka consumer that writes orders into PostgreSQL
  expiry              the payment-expiry worker (safe to run several)
  broker              the embedded Kafka broker alone, persisted under .flashsale/kafka (for stacks of separate processes)
  migrate             apply the database schema
  config              print the effective settings, secrets redacted, and check them
  token --user ID     print a signed access token [--role operator] [--ttl 1h]
  verify-draw --sale ID   recompute a sale's pre-queue draw from its published seed
  verify-draw --url URL   the same from the public draw record, without Redis [--sale ID] [--user N]
  healthcheck --url U     exit 0 when U answers 200 (for container health checks)

Run "flashsale <command> -h" for a command's flags. Configuration: see README.md.
`

func main() {
	wiring.RaiseFileLimit()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmds := map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
		"dev":         cmdDev,
		"gateway":     roleCmd("gateway"),
		"writer":      roleCmd("writer"),
		"expiry":      roleCmd("expiry"),
		"broker":      cmdBroker,
		"config":      cmdConfig,
		"migrate":     cmdMigrate,
		"token":       cmdToken,
		"verify-draw": cmdVerifyDraw,
		"healthcheck": cmdHealthcheck,
	}
	fn, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "flashsale: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	err := fn(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "flashsale %s: %v\n", args[0], err)
		return 1
	}
}

// errUsage marks an error already explained to the user by the flag set.
var errUsage = errors.New("usage")

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("flashsale "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

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

func newLogger(format, level string, w io.Writer) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
