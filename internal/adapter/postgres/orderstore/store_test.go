package orderstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// saleItem stores a sale with one item of quantity q and returns their ids.
func saleItem(t *testing.T, pool *pgxpool.Pool, q int) (sale, item int64) {
	t.Helper()
	ctx := context.Background()
	if err := pool.QueryRow(ctx, `INSERT INTO sales (name, starts_at, admission_rate, shuffle_seed, shuffle_commitment)
		VALUES ('s', now(), 10, '\x00', 'c') RETURNING id`).Scan(&sale); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO items (sale_id, product_id, quantity, price_cents)
		VALUES ($1, 1, $2, 500) RETURNING id`, sale, q).Scan(&item); err != nil {
		t.Fatal(err)
	}
	return sale, item
}

// soldOf is the item's sold count (items.sold).
func soldOf(t *testing.T, pool *pgxpool.Pool, item int64) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT sold FROM items WHERE id = $1`, item).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// trail is an order's events (types, in id order) and whether a stock
// return is owed for it.
func trail(t *testing.T, pool *pgxpool.Pool, id string) (types []string, owed bool) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT type FROM order_events WHERE order_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var ty string
		if err := rows.Scan(&ty); err != nil {
			t.Fatal(err)
		}
		types = append(types, ty)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM stock_returns WHERE order_id = $1)`, id).Scan(&owed); err != nil {
		t.Fatal(err)
	}
	return types, owed
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestChangesWriteEventAndReturnOnce: each named change writes its event,
// and a change that gives a unit back its stock return, exactly when the
// change happens; repeating it writes nothing.
func TestChangesWriteEventAndReturnOnce(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	st := orderstore.New(pool)
	sale, item := saleItem(t, pool, 10)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	place := func(user int64) orderstore.Placed {
		return orderstore.Placed{ID: uuid.New(), SaleID: sale, ItemID: item, UserID: user, PriceCents: 500,
			CreatedAt: now, ExpiresAt: now.Add(10 * time.Minute)}
	}
	paid, cancelled, expired := place(1), place(2), place(3)
	batch := []orderstore.Placed{paid, cancelled, expired}
	for i := range 2 { // the second time: redeliveries, nothing new
		inserted, _, err := st.Place(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for j, ok := range inserted {
			if ok != (i == 0) {
				t.Fatalf("Place round %d: inserted[%d] = %v, want %v", i, j, ok, i == 0)
			}
		}
	}
	for range 2 {
		if _, _, err := st.Pay(ctx, 1, paid.ID.String(), now); err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.Cancel(ctx, 2, cancelled.ID.String(), now); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Expire(ctx, now.Add(11*time.Minute), 10); err != nil {
			t.Fatal(err)
		}
	}
	lost := orderstore.Lost{OrderID: uuid.NewString(), SaleID: sale, ItemID: item, UserID: 4, Price: 500,
		ReservedAt: now, ExpiresAt: now.Add(10 * time.Minute), Reason: "lost"}
	for i := range 2 {
		inserted, err := st.Tombstone(ctx, lost, now)
		if err != nil || inserted != (i == 0) {
			t.Fatalf("Tombstone round %d: %v, %v; want %v", i, inserted, err, i == 0)
		}
	}
	refused := orderstore.Rejected{Placed: place(5), Reason: "SOLD_OUT"}
	for i := range 2 {
		fresh, err := st.Reject(ctx, []orderstore.Rejected{refused}, now)
		if err != nil || fresh[refused.ID] != (i == 0) {
			t.Fatalf("Reject round %d: %v, %v; want fresh %v", i, fresh, err, i == 0)
		}
	}
	for _, tc := range []struct {
		name  string
		id    string
		types []string
		owed  bool
	}{
		{"paid", paid.ID.String(), []string{"order.pending", "order.paid"}, false},
		{"cancelled", cancelled.ID.String(), []string{"order.pending", "order.cancelled"}, true},
		{"expired", expired.ID.String(), []string{"order.pending", "order.expired"}, true},
		{"tombstone", lost.OrderID, []string{"order.rejected"}, true},
		{"rejected", refused.ID.String(), []string{"order.rejected"}, true},
	} {
		types, owed := trail(t, pool, tc.id)
		if !equal(types, tc.types) || owed != tc.owed {
			t.Errorf("%s: events %v, return owed %v; want %v, %v", tc.name, types, owed, tc.types, tc.owed)
		}
	}
	if sold := soldOf(t, pool, item); sold != 1 {
		t.Errorf("items.sold = %d, want 1 (the paid order)", sold)
	}
	o, ok, err := st.Get(ctx, 1, paid.ID.String(), now)
	if err != nil || !ok || o.Status != flashsale.OrderPaid {
		t.Errorf("Get(paid) = %+v, %v, %v; want PAID", o, ok, err)
	}
}
