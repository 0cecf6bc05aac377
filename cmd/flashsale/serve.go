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
	"strings"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/wiring"
)

const shutdownGrace = 20 * time.Second

// commonFlags registers the flags every serving role shares; they override
// the environment.
func commonFlags(fs *flag.FlagSet, c *wiring.Config) {
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "public listener (FLASHSALE_HTTP_ADDR)")
	fs.StringVar(&c.AdminAddr, "admin-addr", c.AdminAddr, "metrics/health listener (FLASHSALE_ADMIN_ADDR)")
	redisFlags(fs, c)
	fs.StringVar(&c.DatabaseURL, "database-url", c.DatabaseURL, "postgres://... (FLASHSALE_DATABASE_URL)")
	fs.Func("kafka-brokers", "comma-separated seed brokers (FLASHSALE_KAFKA_BROKERS)", func(v string) error {
		c.KafkaBrokers = splitComma(v)
		return nil
	})
	fs.DurationVar(&c.PaymentWindow, "payment-window", c.PaymentWindow, "how long a reservation may stay unpaid (FLASHSALE_PAYMENT_WINDOW)")
	fs.DurationVar(&c.ExpiryInterval, "expiry-interval", c.ExpiryInterval, "expiry scan interval (FLASHSALE_EXPIRY_INTERVAL)")
	fs.DurationVar(&c.AdmissionTTL, "admission-ttl", c.AdmissionTTL, "admission token lifetime (FLASHSALE_ADMISSION_TTL)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "json or text (FLASHSALE_LOG_FORMAT)")
	fs.DurationVar(&c.DrainPeriod, "drain-period", c.DrainPeriod, "after SIGTERM, how long /readyz answers 503 before the listeners close (FLASHSALE_DRAIN_PERIOD)")
}

// redisFlags registers the Redis topology flags. The password has no flag,
// so that it never shows in a process list: FLASHSALE_REDIS_PASSWORD or
// the URL carry it.
func redisFlags(fs *flag.FlagSet, c *wiring.Config) {
	fs.StringVar(&c.RedisURL, "redis-url", c.RedisURL, "one Redis node: redis://host:port/db or rediss:// (FLASHSALE_REDIS_URL)")
	fs.Func("redis-cluster", "comma-separated host:port seeds of a Redis Cluster (FLASHSALE_REDIS_CLUSTER)", func(v string) error {
		c.RedisCluster = splitComma(v)
		return nil
	})
	fs.Func("redis-sentinels", "comma-separated host:port of Redis Sentinels (FLASHSALE_REDIS_SENTINELS)", func(v string) error {
		c.RedisSentinels = splitComma(v)
		return nil
	})
	fs.StringVar(&c.RedisMaster, "redis-master", c.RedisMaster, "the master's name the Sentinels monitor (FLASHSALE_REDIS_MASTER)")
	fs.StringVar(&c.RedisTLSCA, "redis-tls-ca", c.RedisTLSCA, "PEM file of the CA of the Redis nodes' certificates (FLASHSALE_REDIS_TLS_CA)")
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

// roleCmd runs one production role against configured dependencies.
func roleCmd(role string) func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		cfg := wiring.Defaults()
		if err := cfg.FromEnv(os.Getenv); err != nil {
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
	cfg := wiring.Defaults()
	cfg.LogFormat = "text"
	if err := cfg.FromEnv(os.Getenv); err != nil {
		return err
	}
	if os.Getenv("FLASHSALE_DRAIN_PERIOD") == "" {
		// No load balancer in front of dev: Ctrl-C stops it at once.
		cfg.DrainPeriod = 0
	}
	fs := newFlagSet("dev", stderr)
	commonFlags(fs, &cfg)
	fs.IntVar(&cfg.KafkaPort, "kafka-port", cfg.KafkaPort, "port of the embedded Kafka broker on 127.0.0.1, so other processes (a second gateway) can use it (FLASHSALE_KAFKA_PORT; 0: any)")
	demo := fs.Bool("demo", false, "create a demo sale opening a minute from now and print URLs and tokens")
	dataDir := fs.String("data-dir", envOr("FLASHSALE_DATA_DIR", ".flashsale"), "where local Redis, PostgreSQL and the embedded Kafka keep their data (FLASHSALE_DATA_DIR)")
	fs.StringVar(&cfg.KafkaDataDir, "kafka-data-dir", cfg.KafkaDataDir, "where the embedded Kafka broker keeps its data, every batch written before it is acknowledged (FLASHSALE_KAFKA_DATA_DIR; default <data-dir>/kafka)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
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

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
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
