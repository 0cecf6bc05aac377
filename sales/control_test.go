package sales

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
)

func auditCount(t *testing.T, s *Store, action string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE action = $1`, action).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Every control bumps the version once, writes its audit row and is
// harmless when it changes nothing; a stale version changes nothing.
func TestActVersionsAndAudit(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	now := time.Date(2026, 12, 1, 18, 30, 0, 0, time.UTC)
	s := NewStore(testenv.Postgres(t), rdb, redisstock.New(rdb), func() time.Time { return now })
	sale, err := s.Create(ctx, flashsale.Sale{Name: "Drop", StartsAt: now.Add(-time.Hour), AdmissionRatePerSecond: 5,
		Items: []flashsale.Item{{ProductID: 501, Quantity: 10, PriceCents: 1999, Name: "Red sneaker", Currency: "EUR", ImageURL: "/assets/x.svg"}}})
	if err != nil {
		t.Fatal(err)
	}
	if sale.Version != 1 {
		t.Fatalf("version at creation %d, want 1", sale.Version)
	}
	got, err := s.Get(ctx, sale.ID)
	if err != nil || got.Items[0].Name != "Red sneaker" || got.Items[0].Currency != "EUR" || got.Items[0].ImageURL != "/assets/x.svg" {
		t.Fatalf("item details %+v, %v", got.Items, err)
	}
	act := func(a flashsale.SaleAction) (flashsale.Sale, error) {
		a.Actor = "9"
		return s.Act(ctx, sale.ID, a)
	}
	steps := []struct {
		a           flashsale.SaleAction
		wantVersion int64
	}{
		{flashsale.SaleAction{Kind: flashsale.ActionPause, IfVersion: 1}, 2},
		{flashsale.SaleAction{Kind: flashsale.ActionPause}, 2}, // already paused
		{flashsale.SaleAction{Kind: flashsale.ActionResume, IfVersion: 2}, 3},
		{flashsale.SaleAction{Kind: flashsale.ActionResume}, 3},
		{flashsale.SaleAction{Kind: flashsale.ActionMessage, Text: "Back at 7"}, 4},
		{flashsale.SaleAction{Kind: flashsale.ActionMessage, Text: ""}, 5},
		{flashsale.SaleAction{Kind: flashsale.ActionMessage, Text: ""}, 5}, // nothing to clear
		{flashsale.SaleAction{Kind: flashsale.ActionStock, ItemID: sale.Items[0].ID, Add: 5}, 6},
		{flashsale.SaleAction{Kind: flashsale.ActionEnd}, 7},
		{flashsale.SaleAction{Kind: flashsale.ActionEnd}, 7}, // already ended
	}
	for i, st := range steps {
		out, err := act(st.a)
		if err != nil || out.Version != st.wantVersion {
			t.Fatalf("step %d %s: version %d, %v; want %d", i, st.a.Kind, out.Version, err, st.wantVersion)
		}
	}
	for action, want := range map[string]int{"sale.pause": 1, "sale.resume": 1, "sale.message": 2, "sale.stock": 1, "sale.end": 1} {
		if n := auditCount(t, s, action); n != want {
			t.Errorf("%s audit rows %d, want %d", action, n, want)
		}
	}
	out, _ := s.Get(ctx, sale.ID)
	if out.Items[0].Quantity != 15 || !out.EndsAt.Equal(now) || out.Paused {
		t.Fatalf("after the steps %+v", out)
	}
	rem, err := s.stock.Remaining(ctx, sale.ID)
	if err != nil || rem[sale.Items[0].ID] != 15 {
		t.Fatalf("remaining %v, %v; want 15", rem, err)
	}
	// Refusals change nothing.
	for name, a := range map[string]flashsale.SaleAction{
		"stale":          {Kind: flashsale.ActionPause, IfVersion: 3},
		"unknown item":   {Kind: flashsale.ActionStock, ItemID: 999999, Add: 1},
		"add zero":       {Kind: flashsale.ActionStock, ItemID: sale.Items[0].ID, Add: 0},
		"add over limit": {Kind: flashsale.ActionStock, ItemID: sale.Items[0].ID, Add: flashsale.MaxStockAdd + 1},
	} {
		if _, err := act(a); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := s.Act(ctx, 999999, flashsale.SaleAction{Kind: flashsale.ActionPause}); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Errorf("unknown sale: %v, want NOT_FOUND", err)
	}
	after, _ := s.Get(ctx, sale.ID)
	if after.Version != 7 || after.Paused || after.Items[0].Quantity != 15 {
		t.Fatalf("a refusal changed the sale: %+v", after)
	}
	if _, err := s.Update(ctx, sale.ID, flashsale.SaleUpdate{IfVersion: 6}); flashsale.ErrorCode(err) != flashsale.CodeVersionConflict {
		t.Fatalf("stale update: %v, want VERSION_CONFLICT", err)
	}
}

// Of two writes naming the same version, exactly one applies.
func TestActRace(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := NewStore(testenv.Postgres(t), rdb, redisstock.New(rdb), nil)
	sale, err := s.Create(ctx, flashsale.Sale{Name: "Drop", StartsAt: time.Now(), AdmissionRatePerSecond: 5,
		Items: []flashsale.Item{{ProductID: 501, Quantity: 10, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = s.Act(ctx, sale.ID, flashsale.SaleAction{Kind: flashsale.ActionStock, ItemID: sale.Items[0].ID, Add: 1, IfVersion: 1})
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch flashsale.ErrorCode(err) {
		case "":
			ok++
		case flashsale.CodeVersionConflict:
		default:
			t.Fatalf("unexpected %v", err)
		}
	}
	got, _ := s.Get(ctx, sale.ID)
	if ok != 1 || got.Items[0].Quantity != 11 || got.Version != 2 {
		t.Fatalf("%d writes applied, quantity %d, version %d; want 1, 11, 2", ok, got.Items[0].Quantity, got.Version)
	}
}

// A sharded sale's addition is spread over its shards, and an outbox row
// left behind (Redis failed after the commit) is applied once by
// AddPending, however often it runs.
func TestAddStockShardsAndOutbox(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	st := redisstock.New(rdb)
	s := NewStore(testenv.Postgres(t), rdb, st, nil)
	sale, err := s.Create(ctx, flashsale.Sale{Name: "Hot", StartsAt: time.Now(), AdmissionRatePerSecond: 5, StockShards: 3,
		Items: []flashsale.Item{{ProductID: 501, Quantity: 4, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	item := sale.Items[0].ID
	if _, err := s.Act(ctx, sale.ID, flashsale.SaleAction{Kind: flashsale.ActionStock, ItemID: item, Add: 5}); err != nil {
		t.Fatal(err)
	}
	rem, _ := st.Remaining(ctx, sale.ID)
	if rem[item] != 9 {
		t.Fatalf("remaining over the shards %d, want 9", rem[item])
	}
	for sh := range 3 {
		m, _ := st.ShardRemaining(ctx, sale.ID, sh)
		if want := []int64{2 + 2, 1 + 2, 1 + 1}[sh]; m[item] != want {
			t.Errorf("shard %d has %d, want %d", sh, m[item], want)
		}
	}
	// A row whose Redis step did not run.
	if _, err := s.pool.Exec(ctx, `UPDATE items SET quantity = quantity + 3 WHERE id = $1`, item); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO stock_adds (sale_id, item_id, units) VALUES ($1, $2, 3)`, sale.ID, item); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.AddPending(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rem, _ = st.Remaining(ctx, sale.ID)
	var left int
	_ = s.pool.QueryRow(ctx, `SELECT count(*) FROM stock_adds`).Scan(&left)
	if rem[item] != 12 || left != 0 {
		t.Fatalf("after AddPending: remaining %d, rows %d; want 12, 0", rem[item], left)
	}
	// A step retried (its row not deleted) adds nothing twice.
	for range 2 {
		if err := st.AddStock(ctx, sale.ID, 777, item, 3); err != nil {
			t.Fatal(err)
		}
	}
	if rem, _ = st.Remaining(ctx, sale.ID); rem[item] != 15 {
		t.Fatalf("a retried addition: remaining %d, want 15", rem[item])
	}
}

// TestActBesideOrderInserts: an operator's action does not wait for the
// order writer's transactions. An order insert holds KEY SHARE locks on
// its item and sale rows (the foreign keys) until it commits; the
// action's locks must not conflict with them, or an action taken during
// a sale waits for the writer, and deadlocks with it when the writer
// waits for the sale row the action holds.
func TestActBesideOrderInserts(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := NewStore(testenv.Postgres(t), rdb, redisstock.New(rdb), nil)
	sale, err := s.Create(ctx, flashsale.Sale{Name: "Live", StartsAt: time.Now(), AdmissionRatePerSecond: 5,
		Items: []flashsale.Item{{ProductID: 501, Quantity: 1, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	item := sale.Items[0].ID
	// What the writer's foreign-key checks hold, in its order: the item,
	// then the sale.
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM items WHERE id = $1 FOR KEY SHARE`, item); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM sales WHERE id = $1 FOR KEY SHARE`, sale.ID); err != nil {
		t.Fatal(err)
	}
	for _, a := range []flashsale.SaleAction{
		{Kind: flashsale.ActionStock, ItemID: item, Add: 2},
		{Kind: flashsale.ActionPause},
		{Kind: flashsale.ActionMessage, Text: "more soon"},
	} {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.Act(actx, sale.ID, a)
		cancel()
		if err != nil {
			t.Fatalf("%s while an order insert holds its key locks: %v", a.Kind, err)
		}
	}
}

// The steps of Act, each on a real database.

// newActSale creates a store and an open sale of one item of quantity 10
// for a test of Act's steps.
func newActSale(t *testing.T) (*Store, flashsale.Sale) {
	t.Helper()
	rdb := testenv.Redis(t)
	s := NewStore(testenv.Postgres(t), rdb, redisstock.New(rdb), nil)
	sale, err := s.Create(context.Background(), flashsale.Sale{Name: "Steps", StartsAt: time.Now(), AdmissionRatePerSecond: 5,
		Items: []flashsale.Item{{ProductID: 501, Quantity: 10, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	return s, sale
}

// inTx runs f in a transaction of s's pool that is rolled back after it.
func inTx(t *testing.T, s *Store, f func(tx pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	f(tx)
}

// setControls writes a sale's controls directly.
func setControls(t *testing.T, s *Store, id int64, c saleControls) {
	t.Helper()
	if _, err := s.pool.Exec(context.Background(), `UPDATE sales SET paused = $2, ends_at = $3, message_text = $4 WHERE id = $1`,
		id, c.paused, c.endsAt, c.message); err != nil {
		t.Fatal(err)
	}
}

func TestReadControls(t *testing.T) {
	s, sale := newActSale(t)
	ends := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	for _, want := range []saleControls{
		{},
		{paused: true, endsAt: &ends, message: "Back at 7"},
	} {
		setControls(t, s, sale.ID, want)
		inTx(t, s, func(tx pgx.Tx) {
			got, err := readControls(context.Background(), tx, sale.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.paused != want.paused || got.message != want.message || (got.endsAt == nil) != (want.endsAt == nil) ||
				(got.endsAt != nil && !got.endsAt.Equal(*want.endsAt)) {
				t.Errorf("readControls = %+v, want %+v", got, want)
			}
		})
	}
}

// TestPlanControl decides each control against a stored sale and applies
// the decision with bumpVersion: what it sets is what the sale then
// reads, and a repeated action decides nothing.
func TestPlanControl(t *testing.T) {
	ctx := context.Background()
	s, sale := newActSale(t)
	now := time.Date(2026, 12, 1, 18, 30, 0, 0, time.UTC)
	past, future := now.Add(-time.Minute), now.Add(time.Hour)
	for _, tc := range []struct {
		name    string
		before  saleControls
		a       flashsale.SaleAction
		changes bool
		after   saleControls // when changes
	}{
		{name: "pause an open sale", a: flashsale.SaleAction{Kind: flashsale.ActionPause}, changes: true, after: saleControls{paused: true}},
		{name: "pause a paused sale", before: saleControls{paused: true}, a: flashsale.SaleAction{Kind: flashsale.ActionPause}},
		{name: "resume a paused sale", before: saleControls{paused: true}, a: flashsale.SaleAction{Kind: flashsale.ActionResume}, changes: true},
		{name: "resume an open sale", a: flashsale.SaleAction{Kind: flashsale.ActionResume}},
		{name: "end an endless sale", a: flashsale.SaleAction{Kind: flashsale.ActionEnd}, changes: true, after: saleControls{endsAt: &now}},
		{name: "end a sale ending later", before: saleControls{endsAt: &future}, a: flashsale.SaleAction{Kind: flashsale.ActionEnd},
			changes: true, after: saleControls{endsAt: &now}},
		{name: "end an ended sale", before: saleControls{endsAt: &past}, a: flashsale.SaleAction{Kind: flashsale.ActionEnd}},
		{name: "post a message", a: flashsale.SaleAction{Kind: flashsale.ActionMessage, Text: "Back at 7"}, changes: true,
			after: saleControls{message: "Back at 7"}},
		{name: "clear a message", before: saleControls{message: "Back at 7"}, a: flashsale.SaleAction{Kind: flashsale.ActionMessage},
			changes: true},
		{name: "clear no message", a: flashsale.SaleAction{Kind: flashsale.ActionMessage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setControls(t, s, sale.ID, tc.before)
			ch, err := planControl(tc.before, tc.a, now)
			if err != nil {
				t.Fatal(err)
			}
			if got := ch.changes(); got != tc.changes {
				t.Fatalf("changes = %v, want %v", got, tc.changes)
			}
			if !tc.changes {
				return
			}
			var version int64
			var messageAt *time.Time
			err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				if err := tx.QueryRow(ctx, `SELECT version FROM sales WHERE id = $1`, sale.ID).Scan(&version); err != nil {
					return err
				}
				return bumpVersion(ctx, tx, sale.ID, version, ch.set, ch.args)
			})
			if err != nil {
				t.Fatal(err)
			}
			var got saleControls
			if err := s.pool.QueryRow(ctx, `SELECT paused, ends_at, message_text, message_at FROM sales WHERE id = $1`, sale.ID).
				Scan(&got.paused, &got.endsAt, &got.message, &messageAt); err != nil {
				t.Fatal(err)
			}
			want := tc.after
			if got.paused != want.paused || got.message != want.message || (got.endsAt == nil) != (want.endsAt == nil) ||
				(got.endsAt != nil && !got.endsAt.Equal(*want.endsAt)) {
				t.Errorf("after: %+v, want %+v", got, want)
			}
			if tc.a.Kind == flashsale.ActionMessage && (messageAt != nil) != (tc.a.Text != "") {
				t.Errorf("message_at %v for the message %q: want a time only with a message", messageAt, tc.a.Text)
			}
		})
	}
	if _, err := planControl(saleControls{}, flashsale.SaleAction{Kind: "launch"}, now); err == nil {
		t.Error("unknown action: no error")
	}
}

func TestAddStock(t *testing.T) {
	ctx := context.Background()
	s, sale := newActSale(t)
	other, err := s.Create(ctx, flashsale.Sale{Name: "Other", StartsAt: time.Now(), AdmissionRatePerSecond: 5,
		Items: []flashsale.Item{{ProductID: 502, Quantity: 1, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	item := sale.Items[0].ID

	t.Run("adds and writes the outbox row", func(t *testing.T) {
		inTx(t, s, func(tx pgx.Tx) {
			ch, err := addStock(ctx, tx, sale.ID, item, 5)
			if err != nil {
				t.Fatal(err)
			}
			if ch.itemID != item || ch.units != 5 || ch.addID == 0 || ch.body["quantity"] != int64(15) {
				t.Errorf("change %+v, want item %d, 5 units, an outbox row and quantity 15", ch, item)
			}
			var quantity, units int64
			if err := tx.QueryRow(ctx, `SELECT quantity FROM items WHERE id = $1`, item).Scan(&quantity); err != nil {
				t.Fatal(err)
			}
			if err := tx.QueryRow(ctx, `SELECT units FROM stock_adds WHERE id = $1 AND sale_id = $2 AND item_id = $3`,
				ch.addID, sale.ID, item).Scan(&units); err != nil {
				t.Fatal(err)
			}
			if quantity != 15 || units != 5 {
				t.Errorf("quantity %d, outbox units %d; want 15, 5", quantity, units)
			}
		})
	})
	for _, tc := range []struct {
		name     string
		item     int64
		units    int64
		quantity int64 // the item's quantity before; 0: as created
		want     flashsale.Code
	}{
		{name: "item of another sale", item: other.Items[0].ID, units: 1, want: flashsale.CodeNotFound},
		{name: "no such item", item: 999999, units: 1, want: flashsale.CodeNotFound},
		{name: "no units", item: item, units: 0, want: flashsale.CodeInvalid},
		{name: "over MaxStockAdd", item: item, units: flashsale.MaxStockAdd + 1, want: flashsale.CodeInvalid},
		{name: "past an INT", item: item, units: 2, quantity: maxQuantity - 1, want: flashsale.CodeInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inTx(t, s, func(tx pgx.Tx) {
				if tc.quantity != 0 {
					if _, err := tx.Exec(ctx, `UPDATE items SET quantity = $2 WHERE id = $1`, tc.item, tc.quantity); err != nil {
						t.Fatal(err)
					}
				}
				ch, err := addStock(ctx, tx, sale.ID, tc.item, tc.units)
				if got := flashsale.ErrorCode(err); got != tc.want || ch.changes() {
					t.Errorf("addStock: %v, change %+v; want %s and no change", err, ch, tc.want)
				}
				var rows int
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM stock_adds`).Scan(&rows); err != nil {
					t.Fatal(err)
				}
				if rows != 0 {
					t.Errorf("%d outbox rows after a refusal, want 0", rows)
				}
			})
		})
	}
}

func TestBumpVersion(t *testing.T) {
	ctx := context.Background()
	s, sale := newActSale(t)
	inTx(t, s, func(tx pgx.Tx) {
		if err := bumpVersion(ctx, tx, sale.ID, sale.Version, "", nil); err != nil {
			t.Fatalf("at the sale's version: %v", err)
		}
		var version int64
		if err := tx.QueryRow(ctx, `SELECT version FROM sales WHERE id = $1`, sale.ID).Scan(&version); err != nil {
			t.Fatal(err)
		}
		if version != sale.Version+1 {
			t.Errorf("version %d, want %d", version, sale.Version+1)
		}
		if err := bumpVersion(ctx, tx, sale.ID, sale.Version, `paused = $3`, []any{true}); flashsale.ErrorCode(err) != flashsale.CodeVersionConflict {
			t.Errorf("at a stale version: %v, want VERSION_CONFLICT", err)
		}
	})
}

// TestActTx: the transaction writes a change, its version and its audit
// row, and nothing for an action that changes nothing or is refused.
func TestActTx(t *testing.T) {
	ctx := context.Background()
	s, sale := newActSale(t)
	now := time.Now().UTC()
	for _, tc := range []struct {
		name    string
		a       flashsale.SaleAction
		changes bool
		want    flashsale.Code
	}{
		{name: "a change", a: flashsale.SaleAction{Kind: flashsale.ActionPause, Actor: "9"}, changes: true},
		{name: "no change", a: flashsale.SaleAction{Kind: flashsale.ActionResume, Actor: "9"}},
		{name: "stale version", a: flashsale.SaleAction{Kind: flashsale.ActionPause, IfVersion: sale.Version + 1}, want: flashsale.CodeVersionConflict},
		{name: "refused addition", a: flashsale.SaleAction{Kind: flashsale.ActionStock, ItemID: sale.Items[0].ID}, want: flashsale.CodeInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inTx(t, s, func(tx pgx.Tx) {
				ch, err := s.actTx(ctx, tx, sale.ID, tc.a, now)
				if got := flashsale.ErrorCode(err); got != tc.want || ch.changes() != tc.changes {
					t.Fatalf("actTx: %v, changes %v; want %q, %v", err, ch.changes(), tc.want, tc.changes)
				}
				var version int64
				var audits int
				if err := tx.QueryRow(ctx, `SELECT version FROM sales WHERE id = $1`, sale.ID).Scan(&version); err != nil {
					t.Fatal(err)
				}
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE actor = '9' AND body->>'saleId' = $1`, strconv.FormatInt(sale.ID, 10)).Scan(&audits); err != nil {
					t.Fatal(err)
				}
				wantVersion, wantAudits := sale.Version, 0
				if tc.changes {
					wantVersion, wantAudits = sale.Version+1, 1
				}
				if version != wantVersion || audits != wantAudits {
					t.Errorf("version %d, audit rows %d; want %d, %d", version, audits, wantVersion, wantAudits)
				}
			})
		})
	}
}

func TestActError(t *testing.T) {
	ctx := context.Background()
	s, _ := newActSale(t)
	// A database error, as the transaction would return it.
	dbErr := s.pool.QueryRow(ctx, `SELECT no_such_column FROM sales`).Scan(new(int))
	if dbErr == nil {
		t.Fatal("the broken query did not fail")
	}
	for _, tc := range []struct {
		name string
		err  error
		want error // nil: nil
		same bool  // answered as it is
	}{
		{name: "none"},
		{name: "not found", err: errNoItem, want: errNoItem, same: true},
		{name: "conflict", err: errConflict, want: errConflict, same: true},
		{name: "invalid", err: flashsale.Invalid("add", "no"), same: true},
		{name: "database", err: dbErr, want: dbErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := actError(flashsale.ActionStock, tc.err)
			switch {
			case tc.err == nil:
				if got != nil {
					t.Errorf("actError(nil) = %v, want nil", got)
				}
			case tc.same:
				if got != tc.err {
					t.Errorf("actError(%v) = %v, want it as it is", tc.err, got)
				}
			default:
				prefix := "sales.Act " + string(flashsale.ActionStock) + ": "
				if !errors.Is(got, tc.want) || !strings.HasPrefix(got.Error(), prefix) {
					t.Errorf("actError(%v) = %v, want it wrapped with %q", tc.err, got, prefix)
				}
			}
		})
	}
}

// TestAfterAct: a committed addition's units reach Redis and its outbox
// row goes; a change is announced, no change is not.
func TestAfterAct(t *testing.T) {
	ctx := context.Background()
	s, sale := newActSale(t)
	quiet, err := s.Create(ctx, flashsale.Sale{Name: "Quiet", StartsAt: time.Now(), AdmissionRatePerSecond: 5,
		Items: []flashsale.Item{{ProductID: 502, Quantity: 1, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	item := sale.Items[0].ID
	var ch actionChange
	if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) (err error) {
		ch, err = s.actTx(ctx, tx, sale.ID, flashsale.SaleAction{Kind: flashsale.ActionStock, ItemID: item, Add: 5}, time.Now())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sub := s.rdb.Subscribe(ctx, lua.SalesChannel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // subscribed
		t.Fatal(err)
	}
	s.afterAct(ctx, quiet.ID, actionChange{})
	s.afterAct(ctx, sale.ID, ch)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msg, err := sub.ReceiveMessage(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.FormatInt(sale.ID, 10); msg.Payload != want {
		t.Errorf("first announcement for sale %s, want %s (no change announces nothing)", msg.Payload, want)
	}
	rem, err := s.stock.Remaining(ctx, sale.ID)
	if err != nil || rem[item] != 15 {
		t.Errorf("remaining %v, %v; want 15", rem, err)
	}
	var rows int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM stock_adds`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("%d outbox rows after the units reached Redis, want 0", rows)
	}
}
