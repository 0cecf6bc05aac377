package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/wiring"
)

func cmdToken(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("token", stderr)
	user := fs.String("user", "", "user id (a positive decimal int64)")
	role := fs.String("role", "", `"operator" for an operator token`)
	ttl := fs.Duration("ttl", time.Hour, "lifetime")
	cfg := wiring.Defaults()
	if err := cfg.LoadEnv(); err != nil {
		return err
	}
	secret := fs.String("secret", cfg.JWTSecret, "HS256 secret (default $FLASHSALE_JWT_SECRET)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	id, err := strconv.ParseInt(*user, 10, 64)
	if err != nil || id <= 0 {
		return fmt.Errorf("--user must be a positive integer, got %q", *user)
	}
	if *role != "" && *role != "operator" {
		return fmt.Errorf(`--role must be "operator" or empty, got %q`, *role)
	}
	if *secret == "" {
		return fmt.Errorf("no secret: set FLASHSALE_JWT_SECRET or --secret (the one the server runs with; flashsale dev makes a random one unless it is set)")
	}
	tok, err := auth.Mint(*secret, id, *role == "operator", *ttl, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := wiring.Defaults()
	if err := cfg.LoadEnv(); err != nil {
		return err
	}
	fs := newFlagSet("migrate", stderr)
	cfg.RegisterFlags(fs, "FLASHSALE_DATABASE_URL")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if cfg.DatabaseURL == "" {
		return fmt.Errorf("FLASHSALE_DATABASE_URL is not set")
	}
	pool, err := postgres.Open(ctx, postgres.Config{URL: cfg.DatabaseURL, MaxConns: 2})
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "schema at version %d\n", postgres.SchemaVersion())
	return nil
}

func cmdHealthcheck(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("healthcheck", stderr)
	url := fs.String("url", "http://127.0.0.1:9090/readyz", "URL that must answer 200")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", *url, resp.Status)
	}
	return nil
}
