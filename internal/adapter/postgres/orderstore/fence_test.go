package orderstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// A rebuild's fence refuses exactly the records of reservations made
// before the loss was seen that landed at or past the end offsets the
// rebuild read (a partition it did not name from its start), and the
// writer's statements apply the rule that Fence.Refuses states.
func TestFenceRefusesWhatTheRebuildDidNotCount(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	st := orderstore.New(pool)
	sale, item := saleItem(t, pool, 10)
	seen := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	f := orderstore.NewFence(seen, map[int32]int64{0: 100})
	if err := st.AddFence(ctx, sale, []int64{item}, f); err != nil {
		t.Fatal(err)
	}
	user := int64(0)
	order := func(created time.Time, part int32, off int64) orderstore.Placed {
		user++
		return orderstore.Placed{ID: uuid.New(), SaleID: sale, ItemID: item, UserID: user, PriceCents: 500,
			CreatedAt: created, ExpiresAt: created.Add(10 * time.Minute), Partition: part, Offset: off}
	}
	before, after := seen.Add(-time.Millisecond), seen
	for _, tc := range []struct {
		name    string
		o       orderstore.Placed
		refused bool
	}{
		{"before the end, before the loss: counted", order(before, 0, 99), false},
		{"past the end, after the loss: the rebuilt Redis's", order(after, 0, 100), false},
		{"at the end, before the loss: not counted", order(before, 0, 100), true},
		{"past the end, before the loss", order(before, 0, 5000), true},
		{"a partition the rebuild saw empty, before the loss", order(before, 1, 0), true},
		{"a partition the rebuild saw empty, after the loss", order(after, 1, 0), false},
	} {
		if got := f.Refuses(tc.o.Partition, tc.o.Offset, tc.o.CreatedAt); got != tc.refused {
			t.Errorf("%s: Refuses = %v, want %v", tc.name, got, tc.refused)
		}
		_, _, err := st.Place(ctx, []orderstore.Placed{tc.o})
		if tc.refused != errors.Is(err, orderstore.ErrFenced) || (!tc.refused && err != nil) {
			t.Errorf("%s: Place = %v; refused %v wanted", tc.name, err, tc.refused)
		}
	}
	// A batch with one fenced record is refused whole (the writer splits
	// it to find the record), and nothing of it is written.
	_, _, err := st.Place(ctx, []orderstore.Placed{order(after, 0, 200), order(before, 0, 201)})
	if !errors.Is(err, orderstore.ErrFenced) {
		t.Fatalf("a batch with a fenced record: %v, want ErrFenced", err)
	}
	if sold := soldOf(t, pool, item); sold != 3 {
		t.Fatalf("sold = %d, want the 3 records not fenced", sold)
	}
}

// A fence committed while the writer's one statement waits for the item's
// row lock is read by that statement's guard: the rebuild counts the
// database after its fence is committed, so a record neither counted nor
// refused would sell a unit twice.
func TestFenceCommittedDuringTheCountingStatement(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	st := orderstore.New(pool)
	sale, item := saleItem(t, pool, 10)
	seen := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	fences, err := json.Marshal([]orderstore.Fence{orderstore.NewFence(seen, map[int32]int64{0: 10})})
	if err != nil {
		t.Fatal(err)
	}
	// A fence being written: its transaction holds the item's row.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := tx.Exec(ctx, `UPDATE items SET stock_fences = $2 WHERE id = $1`, item, fences); err != nil {
		t.Fatal(err)
	}
	var fencer int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&fencer); err != nil {
		t.Fatal(err)
	}
	o := orderstore.Placed{ID: uuid.New(), SaleID: sale, ItemID: item, UserID: 1, PriceCents: 500,
		CreatedAt: seen.Add(-time.Second), ExpiresAt: seen.Add(time.Hour), Partition: 0, Offset: 10}
	done := make(chan error, 1)
	go func() { _, _, err := st.Place(ctx, []orderstore.Placed{o}); done <- err }()
	testenv.Eventually(t, "the writer's statement waiting for the item's row", 10*time.Second, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND pg_blocking_pids(pid) @> ARRAY[$1::int]`, fencer).Scan(&n)
		return err == nil && n == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, orderstore.ErrFenced) {
		t.Fatalf("Place waiting on the fence's commit = %v, want ErrFenced", err)
	}
}
