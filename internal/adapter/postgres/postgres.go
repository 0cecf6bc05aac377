// Package postgres is the PostgreSQL adapter shared by the components: the
// connection pool and the schema migrations. The schema is in migrations/.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Config bounds the database load a component may put on a shared database.
type Config struct {
	URL      string
	MaxConns int32 // 0: pgx default
	// MinConns are opened at start, in the background, and kept (at most
	// MaxConns; a pool_min_conns in URL wins). A sale's opening then finds
	// warm connections instead of making PostgreSQL start a backend per
	// connection while the machine is busiest. 0: none.
	MinConns int32
	// AcquireTimeout bounds the wait for a pooled connection (pgx waits
	// forever otherwise). 0: 5s.
	AcquireTimeout time.Duration
}

// Open connects a pool and checks the connection.
func Open(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("postgres.Open: %w", err)
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	if cfg.MinConns > 0 && pc.MinConns == 0 {
		pc.MinConns = min(cfg.MinConns, pc.MaxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres.Open: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres.Open: %w", err)
	}
	return pool, nil
}

type migration struct {
	version int
	name    string
	sql     string
}

func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrations, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		n := e.Name()
		v, err := strconv.Atoi(strings.SplitN(n, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s: bad version: %w", n, err)
		}
		b, err := migrations.ReadFile("migrations/" + n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: n, sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// SchemaVersion is the newest migration version this build knows.
func SchemaVersion() int {
	ms, err := loadMigrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].version
}

// Migrate applies every migration not yet applied, each in its own
// transaction, under an advisory lock so concurrent starters do not race.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	ms, err := loadMigrations()
	if err != nil {
		return fmt.Errorf("postgres.Migrate: %w", err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres.Migrate: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(726172)`); err != nil {
		return fmt.Errorf("postgres.Migrate: lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(726172)`) //nolint:errcheck // unlock on a pooled conn; session end frees it too
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("postgres.Migrate: %w", err)
	}
	for _, m := range ms {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM schema_migrations WHERE version = $1`, m.version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name)
			return err
		})
		if err != nil {
			return fmt.Errorf("postgres.Migrate: %s: %w", m.name, err)
		}
	}
	return nil
}

// CheckSchema returns an error unless the database has every migration of
// this build applied (for /readyz).
func CheckSchema(ctx context.Context, pool *pgxpool.Pool) error {
	var v int
	err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&v)
	if err != nil {
		return fmt.Errorf("postgres.CheckSchema: %w", err)
	}
	if want := SchemaVersion(); v < want {
		return fmt.Errorf("postgres.CheckSchema: %w", errors.New("schema at version "+strconv.Itoa(v)+", want "+strconv.Itoa(want)))
	}
	return nil
}
