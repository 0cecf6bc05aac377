package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale/internal/harness/localsvc"
)

// localDeps are the services `flashsale dev` started itself.
type localDeps struct {
	redis *localsvc.Redis
	pg    *localsvc.Postgres
}

func (d *localDeps) stop(log *slog.Logger) {
	if d.redis != nil {
		log.Info("stopping redis-server")
		d.redis.Stop()
	}
	if d.pg != nil {
		log.Info("stopping PostgreSQL")
		if err := d.pg.Stop(); err != nil {
			log.Warn("PostgreSQL did not stop cleanly", "err", err)
		}
	}
}

// installDebian installs Debian packages when running as root with apt-get;
// otherwise it says what to install.
func installDebian(ctx context.Context, log *slog.Logger, pkgs ...string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("missing %s: install it (Debian/Ubuntu: sudo apt-get install %s) or set the URL variables to existing servers", strings.Join(pkgs, ", "), strings.Join(pkgs, " "))
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("missing %s and no apt-get here: install it or set the URL variables to existing servers", strings.Join(pkgs, ", "))
	}
	log.Info("installing Debian packages (first run only)", "packages", pkgs)
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("apt-get %s: %w", args[0], err)
		}
	}
	// The packages start system services of their own; ours are separate.
	for _, svc := range []string{"redis-server", "postgresql"} {
		_ = exec.Command("service", svc, "stop").Run()
	}
	return nil
}

// startLocalDeps starts redis-server and PostgreSQL under dataDir for every
// dependency left unconfigured, and fills the URLs in. redisSet is true
// when any Redis setting is given (URL, cluster, Sentinel, password, CA):
// then no redis-server is started.
func startLocalDeps(ctx context.Context, log *slog.Logger, dataDir string, redisSet bool, redisURL, dbURL *string) (*localDeps, error) {
	d := &localDeps{}
	if !redisSet {
		r, err := localsvc.StartRedis(ctx, localsvc.RedisOptions{Dir: filepath.Join(dataDir, "redis"), Persist: true})
		if errors.Is(err, localsvc.ErrMissing) {
			if err = installDebian(ctx, log, "redis-server"); err == nil {
				r, err = localsvc.StartRedis(ctx, localsvc.RedisOptions{Dir: filepath.Join(dataDir, "redis"), Persist: true})
			}
		}
		if err != nil {
			return d, err
		}
		d.redis = r
		*redisURL = r.URL
		log.Info("started redis-server", "url", r.URL, "dir", filepath.Join(dataDir, "redis"))
	}
	if *dbURL == "" {
		dir, err := filepath.Abs(filepath.Join(dataDir, "pg"))
		if err != nil {
			return d, err
		}
		pg, err := localsvc.StartPostgres(ctx, localsvc.PostgresOptions{Dir: dir})
		if errors.Is(err, localsvc.ErrMissing) {
			if err = installDebian(ctx, log, "postgresql"); err == nil {
				pg, err = localsvc.StartPostgres(ctx, localsvc.PostgresOptions{Dir: dir})
			}
		}
		if err != nil {
			return d, err
		}
		d.pg = pg
		if err := createDatabase(ctx, pg.URL, "flashsale"); err != nil {
			return d, err
		}
		*dbURL = pg.DatabaseURL("flashsale")
		log.Info("started PostgreSQL", "url", *dbURL, "dir", dir)
	}
	return d, nil
}

func createDatabase(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	return err
}
