package loadtest

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/adapter/redisconn"
)

// redisCounter reads INFO stats total_commands_processed, summed over
// every master (a cluster's nodes each count their own commands).
type redisCounter struct{ c redis.UniversalClient }

func newRedisCounter(cfg redisconn.Config) (*redisCounter, error) {
	cfg.PoolSize = 1
	c, err := redisconn.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("loadtest: redis: %w", err)
	}
	return &redisCounter{c: c}, nil
}

func (r *redisCounter) close() { r.c.Close() }

func (r *redisCounter) total(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := redisconn.Commands(ctx, r.c)
	if err != nil {
		return 0, fmt.Errorf("loadtest: redis: %w", err)
	}
	return n, nil
}

// excessPerRequest is the Redis commands per hostile request beyond the
// idle baseline rate.
func (r *RedisReport) computeExcess() {
	if r.HostileRequests == 0 {
		return
	}
	expected := 0.0
	if r.BaselineMs > 0 {
		expected = float64(r.BaselineCommands) / float64(r.BaselineMs) * float64(r.HostileMs)
	}
	r.ExcessPerRequest = (float64(r.HostileCommands) - expected) / float64(r.HostileRequests)
}

// checkPostgres adds the database invariants of sale saleID.
func (r *Report) checkPostgres(ctx context.Context, url string, saleID int64) {
	add := func(c InvariantResult) { r.Invariants = append(r.Invariants, c) }
	fail := func(err error) {
		add(InvariantResult{Name: "one order per user (PostgreSQL)", Detail: err.Error()})
		add(InvariantResult{Name: "no reservation before the opening (PostgreSQL)", Detail: err.Error()})
		add(InvariantResult{Name: "every order told to its shopper (PostgreSQL)", Detail: err.Error()})
		add(InvariantResult{Name: "orders ≤ stock (PostgreSQL)", Detail: err.Error()})
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		fail(fmt.Errorf("connect: %w", err))
		return
	}
	defer conn.Close(context.Background())

	rows, err := conn.Query(ctx, `SELECT sale_id, user_id, count(*) FROM orders
		WHERE status IN ('PENDING','PAID') AND sale_id = $1 GROUP BY 1, 2 HAVING count(*) > 1`, saleID)
	if err != nil {
		fail(err)
		return
	}
	var dups []string
	for rows.Next() {
		var sale, user, n int64
		if err := rows.Scan(&sale, &user, &n); err != nil {
			rows.Close()
			fail(err)
			return
		}
		dups = append(dups, fmt.Sprintf("sale %d user %d: %d live orders", sale, user, n))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		fail(err)
		return
	}
	add(InvariantResult{Name: "one order per user (PostgreSQL)", OK: len(dups) == 0, Detail: joinMax(dups, 10)})
	if err := r.checkOrderRows(ctx, conn, saleID); err != nil {
		add(InvariantResult{Name: "no reservation before the opening (PostgreSQL)", Detail: err.Error()})
		add(InvariantResult{Name: "every order told to its shopper (PostgreSQL)", Detail: err.Error()})
	}

	rows, err = conn.Query(ctx, `SELECT i.id, i.quantity, i.sold,
		count(o.id) FILTER (WHERE o.status IN ('PENDING','PAID'))
		FROM items i LEFT JOIN orders o ON o.item_id = i.id
		WHERE i.sale_id = $1 GROUP BY i.id, i.quantity, i.sold`, saleID)
	if err != nil {
		add(InvariantResult{Name: "orders ≤ stock (PostgreSQL)", Detail: err.Error()})
		return
	}
	defer rows.Close()
	var bad []string
	n := 0
	var pgOver int64
	defer func() {
		if r.Summary != nil {
			r.Summary.Oversold = max(r.Summary.Oversold, pgOver)
		}
	}()
	for rows.Next() {
		var id, q, sold, liveN int64
		if err := rows.Scan(&id, &q, &sold, &liveN); err != nil {
			add(InvariantResult{Name: "orders ≤ stock (PostgreSQL)", Detail: err.Error()})
			return
		}
		n++
		pgOver += max(liveN-q, sold-q, 0)
		if liveN > q || sold > q {
			bad = append(bad, fmt.Sprintf("item %d: %d live orders, items.sold %d, quantity %d", id, liveN, sold, q))
		} else if sold != liveN {
			bad = append(bad, fmt.Sprintf("item %d: items.sold %d ≠ %d live orders", id, sold, liveN))
		}
	}
	if err := rows.Err(); err != nil {
		add(InvariantResult{Name: "orders ≤ stock (PostgreSQL)", Detail: err.Error()})
		return
	}
	sort.Strings(bad)
	if n == 0 {
		bad = append(bad, fmt.Sprintf("sale %d has no items in PostgreSQL", saleID))
	}
	add(InvariantResult{Name: "orders ≤ stock (PostgreSQL)", OK: len(bad) == 0, Detail: joinMax(bad, 10)})
}

// checkOrderRows adds two invariants of the sale's order rows: none was
// reserved before the opening (created_at, the server's clock, against
// the sale's starts_at), and every order the database holds that was ever
// live (not REJECTED) is one its shopper was told of (the run's ledger: a
// 202, a 409 or a 503 naming it, or the sale's order lookup). An order
// nobody was told of is one a shopper left after a "nothing reserved"
// answer although its reservation ran.
func (r *Report) checkOrderRows(ctx context.Context, conn *pgx.Conn, saleID int64) error {
	rows, err := conn.Query(ctx, `SELECT o.id::text, o.user_id, o.status, o.created_at < s.starts_at,
		(extract(epoch FROM o.created_at - s.starts_at) * 1000)::bigint
		FROM orders o JOIN sales s ON s.id = o.sale_id WHERE o.sale_id = $1`, saleID)
	if err != nil {
		return err
	}
	defer rows.Close()
	told := make(map[string]bool, len(r.Ledger))
	for _, e := range r.Ledger {
		told[e.OrderID] = true
	}
	var early, untold []string
	for rows.Next() {
		var id, status string
		var user, relMs int64
		var before bool
		if err := rows.Scan(&id, &user, &status, &before, &relMs); err != nil {
			return err
		}
		if before {
			early = append(early, fmt.Sprintf("order %s of user %d reserved %d ms before the opening", id, user, -relMs))
		}
		if status != "REJECTED" && !told[id] {
			untold = append(untold, fmt.Sprintf("order %s of user %d (%s) never told to its shopper", id, user, status))
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	sort.Strings(early)
	sort.Strings(untold)
	r.Invariants = append(r.Invariants,
		InvariantResult{Name: "no reservation before the opening (PostgreSQL)", OK: len(early) == 0,
			Detail: fmt.Sprintf("%d early: %s", len(early), joinMax(early, 10))},
		InvariantResult{Name: "every order told to its shopper (PostgreSQL)", OK: len(untold) == 0,
			Detail: fmt.Sprintf("%d untold: %s", len(untold), joinMax(untold, 10))})
	return nil
}
