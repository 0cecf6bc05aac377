package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// TestUnavailable: errors of a database that cannot be reached or cannot
// answer in time are outages; the database's own refusals are not.
func TestUnavailable(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	var one int
	sqlErr := pool.QueryRow(ctx, `SELEC 1`).Scan(&one)
	constraintErr := pool.QueryRow(ctx, `SELECT 1 / 0`).Scan(&one)

	port, err := localsvc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port))
	if err != nil {
		t.Fatal(err)
	}
	down, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	refused := down.QueryRow(ctx, `SELECT 1`).Scan(&one)

	slow, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	timedOut := pool.QueryRow(slow, `SELECT pg_sleep(5)`).Scan(&one)

	terminated := func() error {
		conn, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var pid int
		if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		return conn.QueryRow(ctx, `SELECT 1`).Scan(&one)
	}()

	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"syntax error", sqlErr, false},
		{"division by zero", constraintErr, false},
		{"no rows", pgx.ErrNoRows, false},
		{"other", errors.New("boom"), false},
		{"connection refused", refused, true},
		{"deadline", timedOut, true},
		{"backend terminated", terminated, true},
		{"wrapped refusal", fmt.Errorf("op: %w", refused), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if (tc.err == nil) != (tc.name == "nil") {
				t.Fatalf("setup: err = %v", tc.err)
			}
			if got := postgres.Unavailable(tc.err); got != tc.want {
				t.Errorf("Unavailable(%v) = %v, want %v", tc.err, got, tc.want)
			}
			// Outage marks exactly the outages UNAVAILABLE, keeping err.
			got := postgres.Outage(tc.err)
			switch {
			case tc.want && (flashsale.ErrorCode(got) != flashsale.CodeUnavailable || !errors.Is(got, tc.err)):
				t.Errorf("Outage(%v) = %v, want UNAVAILABLE wrapping it", tc.err, got)
			case !tc.want && got != tc.err:
				t.Errorf("Outage(%v) = %v, want it unchanged", tc.err, got)
			}
		})
	}
	// A domain answer passes unchanged, even wrapping an outage.
	domain := fmt.Errorf("%w: %w", flashsale.Errorf(flashsale.CodeNotFound, "no such sale"), refused)
	if got := postgres.Outage(domain); got != domain {
		t.Errorf("Outage(domain answer) = %v, want it unchanged", got)
	}
}
