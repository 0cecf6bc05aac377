package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/wiring"
)

const shutdownGrace = 20 * time.Second

// commonFlags registers the flags every serving role shares (the spec's,
// wiring.Settings); they override the environment.
func commonFlags(fs *flag.FlagSet, c *wiring.Config) {
	c.RegisterFlags(fs, "FLASHSALE_HTTP_ADDR", "FLASHSALE_ADMIN_ADDR")
	redisFlags(fs, c)
	c.RegisterFlags(fs, "FLASHSALE_DATABASE_URL", "FLASHSALE_KAFKA_BROKERS", "FLASHSALE_PAYMENT_WINDOW",
		"FLASHSALE_EXPIRY_INTERVAL", "FLASHSALE_ADMISSION_TTL", "FLASHSALE_LOG_FORMAT", "FLASHSALE_DRAIN_PERIOD")
}

// redisFlags registers the Redis topology flags. The password has no flag,
// so that it never shows in a process list: FLASHSALE_REDIS_PASSWORD or
// the URL carry it.
func redisFlags(fs *flag.FlagSet, c *wiring.Config) {
	c.RegisterFlags(fs, "FLASHSALE_REDIS_URL", "FLASHSALE_REDIS_CLUSTER", "FLASHSALE_REDIS_SENTINELS",
		"FLASHSALE_REDIS_MASTER", "FLASHSALE_REDIS_TLS_CA")
}

// roleCmd runs one production role against configured dependencies.
func roleCmd(role string) func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		cfg := wiring.Defaults()
		if err := cfg.LoadEnv(); err != nil {
			return err
		}
		fs := newFlagSet(role, stderr)
		commonFlags(fs, &cfg)
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if len(cfg.KafkaBrokers) == 0 {
			return fmt.Errorf("FLASHSALE_KAFKA_BROKERS is not set (only `flashsale dev` embeds a broker)")
		}
		log := newLogger(cfg.LogFormat, cfg.LogLevel, stderr).With("role", role)
		roles := wiring.Roles{Gateway: role == "gateway", Writer: role == "writer", Expiry: role == "expiry"}
		a, err := wiring.Start(ctx, cfg, roles, log)
		if err != nil {
			return err
		}
		return serveUntilDone(ctx, a, log)
	}
}

func serveUntilDone(ctx context.Context, a *wiring.App, log *slog.Logger) error {
	select {
	case <-ctx.Done():
		a.Drain(context.Background())
		log.Info("shutting down", "grace", shutdownGrace)
	case <-a.Done():
		log.Error("a component failed; shutting down", "err", a.Err())
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := a.Close(sctx); err != nil {
		log.Warn("shutdown", "err", err)
	}
	return a.Err()
}

func cmdDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := devDefaults()
	if err := cfg.LoadEnv(); err != nil {
		return err
	}
	fs := newFlagSet("dev", stderr)
	commonFlags(fs, &cfg)
	cfg.RegisterFlags(fs, "FLASHSALE_KAFKA_PORT", "FLASHSALE_DATA_DIR", "FLASHSALE_KAFKA_DATA_DIR")
	demo := fs.Bool("demo", false, "create a demo sale opening a minute from now and print URLs and tokens")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	dataDir := &cfg.DataDir
	if cfg.KafkaDataDir == "" {
		// The embedded broker persists like the local Redis and
		// PostgreSQL, so a restart of dev keeps every acknowledged order.
		cfg.KafkaDataDir = filepath.Join(*dataDir, "kafka")
	}
	log := newLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	if cfg.JWTSecret == "" {
		// Random for this run and never printed: the banner's sign-in
		// links carry tokens; set it to keep tokens valid across
		// restarts or to mint more with flashsale token.
		b := make([]byte, wiring.MinSecretBytes)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		cfg.JWTSecret = hex.EncodeToString(b)
	}
	if err := os.MkdirAll(*dataDir, 0o755); err != nil {
		return err
	}
	deps, err := startLocalDeps(ctx, log, *dataDir, cfg.Redis().Set(), &cfg.RedisURL, &cfg.DatabaseURL)
	defer deps.stop(log)
	if err != nil {
		return err
	}
	if err := migrate(ctx, cfg.DatabaseURL); err != nil {
		return err
	}
	a, err := wiring.Start(ctx, cfg, wiring.AllRoles, log)
	if err != nil {
		return err
	}
	printDevBanner(stdout, a, cfg)
	if *demo {
		if err := createDemoSale(ctx, stdout, a, cfg); err != nil {
			a.Close(context.Background())
			return err
		}
	}
	fmt.Fprintln(stdout, "Ctrl-C stops everything this command started.")
	return serveUntilDone(ctx, a, log)
}

// devDefaults are the defaults of `flashsale dev`: text logs, and no
// drain period, since no load balancer is in front of it and Ctrl-C stops
// it at once.
func devDefaults() wiring.Config {
	cfg := wiring.Defaults()
	cfg.LogFormat = "text"
	cfg.DrainPeriod = 0
	return cfg
}

func migrate(ctx context.Context, url string) error {
	pool, err := postgres.Open(ctx, postgres.Config{URL: url, MaxConns: 2})
	if err != nil {
		return err
	}
	defer pool.Close()
	return postgres.Migrate(ctx, pool)
}

func printDevBanner(w io.Writer, a *wiring.App, cfg wiring.Config) {
	abs, _ := filepath.Abs(".")
	fmt.Fprintf(w, `
flashsale dev is running (%s)
  shop page        %s/
  operator console %s/operator
  API              %s/api/...
  metrics, health  %s/metrics  %s/readyz
  Redis            %s
  PostgreSQL       %s
  Kafka            %v
`, abs, a.PublicURL, a.PublicURL, a.PublicURL, a.AdminURL, a.AdminURL, cfg.Redis(), cfg.DatabaseURL, a.KafkaBrokers)
}

func createDemoSale(ctx context.Context, w io.Writer, a *wiring.App, cfg wiring.Config) error {
	now := time.Now()
	sale, err := a.CreateSale(ctx, flashsale.Sale{
		Name:                   "Demo drop",
		StartsAt:               now.Add(time.Minute).Truncate(time.Second),
		AdmissionRatePerSecond: 50,
		Items: []flashsale.Item{
			{ProductID: 501, Quantity: 100, PriceCents: 1999, Name: "Trail runner Aurora", Currency: "EUR", ImageURL: "/assets/sneaker.svg"},
			{ProductID: 502, Quantity: 20, PriceCents: 4999, Name: "Trail runner Aurora, limited edition", Currency: "EUR", ImageURL: "/assets/sneaker.svg"},
		},
	})
	if err != nil {
		return fmt.Errorf("demo sale: %w", err)
	}
	shopper, err := auth.Mint(cfg.JWTSecret, 1001, false, 24*time.Hour, now)
	if err != nil {
		return err
	}
	shopper2, err := auth.Mint(cfg.JWTSecret, 1002, false, 24*time.Hour, now)
	if err != nil {
		return err
	}
	op, err := auth.Mint(cfg.JWTSecret, 1, true, 24*time.Hour, now)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, `
Demo sale %d "%s" opens at %s (in about a minute), items %d and %d.
  shopper 1001     %s/sales/%d#token=%s
  shopper 1002     %s/sales/%d#token=%s
  operator         %s/operator#token=%s
`, sale.ID, sale.Name, sale.StartsAt.Format(time.RFC3339), sale.Items[0].ID, sale.Items[1].ID,
		a.PublicURL, sale.ID, shopper, a.PublicURL, sale.ID, shopper2, a.PublicURL, op)
	return nil
}
