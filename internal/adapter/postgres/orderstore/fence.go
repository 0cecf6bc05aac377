package orderstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Fence is what a Redis-loss rebuild did not count on an item: the orders
// topic's records at or past its end offsets when the rebuild read them,
// of reservations made before the loss was seen. Such a record was taken
// by the lost Redis (the rebuilt one reserves only after the rebuild, and
// every reservation it takes is later than Before) and may not take a
// unit: the writer refuses it (ErrFenced), in the statement that counts
// the item's units, so that every such record is either counted by the
// rebuild or refused, never both nor neither. The fences are written on
// the item's row (AddFence), which that statement locks.
type Fence struct {
	// Before is the time the loss was seen, on the fleet's clock (the
	// records' createdAtMs).
	Before time.Time `json:"before"`
	// Offsets are the end offsets the rebuild read, by partition; a
	// partition not named was empty.
	Offsets map[string]int64 `json:"offsets"`
}

// NewFence is the fence of a rebuild that saw the loss at before and read
// the orders topic up to end (per partition).
func NewFence(before time.Time, end map[int32]int64) Fence {
	f := Fence{Before: before.UTC(), Offsets: make(map[string]int64, len(end))}
	for p, o := range end {
		f.Offsets[strconv.Itoa(int(p))] = o
	}
	return f
}

// Refuses reports whether the record at offset of partition, of a
// reservation made at created, is fenced off. It is fenceGuardSQL's rule,
// which the writer applies; the rebuild applies this one to the records it
// counts, so that a record an earlier fence refuses is not counted.
func (f Fence) Refuses(partition int32, offset int64, created time.Time) bool {
	return created.Before(f.Before) && offset >= f.Offsets[strconv.Itoa(int(partition))]
}

// fenceGuardSQL holds for the item row i when no order of the batch is
// refused by one of i's fences (Fence.Refuses: the same rule); the
// arguments name the batch's per-order arrays of items, creation times,
// partitions and offsets. An item no rebuild ever fenced skips the test.
func fenceGuardSQL(items, created, parts, offs string) string {
	return `(i.stock_fences = '[]'::jsonb OR NOT EXISTS (
	SELECT 1 FROM unnest(` + items + `::int8[], ` + created + `::timestamptz[], ` + parts + `::int4[], ` + offs + `::int8[]) AS o(item, created, part, off),
		jsonb_array_elements(i.stock_fences) AS f
	WHERE o.item = i.id AND o.created < (f->>'before')::timestamptz
		AND o.off >= coalesce((f->'offsets'->>o.part::text)::int8, 0)))`
}

// AddFence writes f on each of the sale's items. It returns once f is
// committed: a writer's statement that counted one of these items' units
// before had committed by then (the update waits for the item row's lock),
// and every later one refuses what f refuses. The rows are locked in id
// order, as the writer locks them.
func (s *Store) AddFence(ctx context.Context, saleID int64, items []int64, f Fence) error {
	b, err := json.Marshal([]Fence{f})
	if err != nil {
		return fmt.Errorf("orderstore.AddFence: %w", err)
	}
	items = slices.Sorted(slices.Values(items))
	_, err = s.pool.Exec(ctx, `UPDATE items SET stock_fences = items.stock_fences || $3::jsonb
		FROM (SELECT id FROM items WHERE sale_id = $1 AND id = ANY($2) ORDER BY id FOR UPDATE) l
		WHERE items.id = l.id`, saleID, items, b)
	if err != nil {
		return fmt.Errorf("orderstore.AddFence: %w", err)
	}
	return nil
}
