package main

import (
	"context"
	"fmt"
	"io"

	"github.com/flashsale/flashsale/internal/wiring"
)

// cmdConfig prints the effective settings of the serving roles: the
// spec's defaults (wiring.Settings), overlaid with the environment and
// the flags, secrets and URL passwords redacted, one a line with the roles
// that read it. It then checks them as every serving role does and fails
// when they would not start one.
func cmdConfig(_ context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := wiring.Defaults()
	if err := cfg.LoadEnv(); err != nil {
		return err
	}
	fs := newFlagSet("config", stderr)
	commonFlags(fs, &cfg)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := wiring.WriteSettings(stdout, &cfg); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("a serving role would not start: %w", err)
	}
	return nil
}
