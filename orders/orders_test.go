package orders_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/orders"
	"github.com/flashsale/flashsale/sales"
	"github.com/flashsale/flashsale/sales/salestest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const window = 10 * time.Minute

// t0 is the injected "now" of every test.
var t0 = time.Date(2026, 12, 1, 18, 30, 0, 0, time.UTC)

type fixture struct {
	pool  *pgxpool.Pool
	rdb   redis.UniversalClient
	stock *redisstock.Store
	cache *sales.Cache
	sale  flashsale.Sale
	svc   *orders.Service
}

// newFixture creates a sale open since an hour before t0 with items items of
// quantity units each, and a Service whose clock reads t0.
func newFixture(t *testing.T, items int, quantity int64) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{pool: testenv.Postgres(t), rdb: testenv.Redis(t)}
	f.stock = redisstock.New(f.rdb)
	store := sales.NewStore(f.pool, f.rdb, f.stock, func() time.Time { return t0 })
	quantities := make([]int64, items)
	for i := range quantities {
		quantities[i] = quantity
	}
	f.sale = salestest.Create(t, store, t0.Add(-time.Hour), 1000, quantities...)
	f.cache = sales.NewCache(store, f.rdb, time.Hour, slog.New(slog.DiscardHandler))
	if err := f.cache.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	f.svc = f.service(f.stock, func() time.Time { return t0 })
	return f
}

func (f *fixture) service(st *redisstock.Store, now func() time.Time) *orders.Service {
	return orders.New(orders.Config{PaymentWindow: window, Now: now}, f.pool, st, f.cache, slog.New(slog.DiscardHandler))
}

// reserve takes a unit in Redis only, as the purchase service does.
func (f *fixture) reserve(t *testing.T, userID, itemID int64, at time.Time) string {
	t.Helper()
	id := uuid.NewString()
	if err := f.stock.Reserve(context.Background(), f.sale.ID, itemID, userID, id, at); err != nil {
		t.Fatalf("reserve user %d: %v", userID, err)
	}
	return id
}

// place reserves a unit and stores the order as the writer does (row,
// items.sold + 1, pending member confirmed), with the given status.
func (f *fixture) place(t *testing.T, userID, itemID int64, created time.Time, status flashsale.OrderStatus) string {
	t.Helper()
	ctx := context.Background()
	id := f.reserve(t, userID, itemID, created)
	it, _ := f.sale.Item(itemID)
	if _, err := f.pool.Exec(ctx, `INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, id, f.sale.ID, itemID, userID, string(status), it.PriceCents, created, created.Add(window)); err != nil {
		t.Fatal(err)
	}
	if status.Live() {
		if _, err := f.pool.Exec(ctx, `UPDATE items SET sold = sold + 1 WHERE id = $1`, itemID); err != nil {
			t.Fatal(err)
		}
	} else if _, err := f.stock.Release(ctx, f.sale.ID, userID, itemID, id); err != nil { // its unit went back long ago
		t.Fatal(err)
	}
	if err := f.stock.Confirm(ctx, []redisstock.Pending{{SaleID: f.sale.ID, OrderID: id, UserID: userID, ItemID: itemID}}); err != nil {
		t.Fatal(err)
	}
	return id
}

func (f *fixture) remaining(t *testing.T, itemID int64) int64 {
	t.Helper()
	r, err := f.stock.Remaining(context.Background(), f.sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	return r[itemID]
}

func (f *fixture) sold(t *testing.T, itemID int64) int64 {
	t.Helper()
	var n int64
	if err := f.pool.QueryRow(context.Background(), `SELECT sold FROM items WHERE id = $1`, itemID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fixture) status(t *testing.T, orderID string) flashsale.OrderStatus {
	t.Helper()
	var s string
	if err := f.pool.QueryRow(context.Background(), `SELECT status FROM orders WHERE id = $1`, orderID).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return flashsale.OrderStatus(s)
}

// events are the types of orderID's order events, in id order, after
// checking each body against its row.
func (f *fixture) events(t *testing.T, orderID string) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT type, (body->>'eventId')::int8 = id
		AND body->>'type' = type AND body->>'orderId' = order_id::text
		AND 'order.' || lower(body->>'status') = type
		AND (body->>'occurredAt')::timestamptz = $2
		FROM order_events WHERE order_id = $1 ORDER BY id`, orderID, t0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for rows.Next() {
		var typ string
		var ok bool
		if err := rows.Scan(&typ, &ok); err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Errorf("order %s: %s event's body disagrees with its row or the clock", orderID, typ)
		}
		types = append(types, typ)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return types
}

func (f *fixture) outbox(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM stock_returns`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSemantics walks the order lifecycle through Get, BySale, Pay and Cancel.
// Each case has its own item (quantity 5) and user.
func TestSemantics(t *testing.T) {
	type step struct {
		op          string // get, bySale, pay, cancel
		other       bool   // as another user
		id          string // instead of the case's order id
		wantCode    flashsale.Code
		wantStatus  flashsale.OrderStatus
		wantPayable bool
	}
	pending, pastWindow := t0.Add(-time.Minute), t0.Add(-window-time.Minute)
	cases := []struct {
		name          string
		setup         string // pending, past, redisOnly, rejected, expired
		steps         []step
		wantRemaining int64 // of 5
		wantSold      int64
		wantDB        flashsale.OrderStatus // "" when not in PostgreSQL
		buyAgain      bool                  // the user can reserve again afterwards
		wantEvents    []string              // the outbox rows the steps wrote, in order
	}{
		{
			name: "pay pending twice", setup: "pending",
			steps: []step{
				{op: "get", wantStatus: flashsale.OrderPending, wantPayable: true},
				{op: "pay", wantStatus: flashsale.OrderPaid},
				{op: "pay", wantStatus: flashsale.OrderPaid},
				{op: "get", wantStatus: flashsale.OrderPaid},
				{op: "bySale", wantStatus: flashsale.OrderPaid},
			},
			wantEvents: []string{"order.paid"}, wantRemaining: 4, wantSold: 1, wantDB: flashsale.OrderPaid,
		},
		{
			name: "cancel paid", setup: "pending",
			steps: []step{
				{op: "pay", wantStatus: flashsale.OrderPaid},
				{op: "cancel", wantCode: flashsale.CodeOrderPaid},
			},
			wantEvents: []string{"order.paid"}, wantRemaining: 4, wantSold: 1, wantDB: flashsale.OrderPaid,
		},
		{
			name: "cancel pending twice", setup: "pending",
			steps: []step{
				{op: "cancel", wantStatus: flashsale.OrderCancelled},
				{op: "cancel", wantStatus: flashsale.OrderCancelled},
				{op: "get", wantStatus: flashsale.OrderCancelled},
				{op: "bySale", wantCode: flashsale.CodeNotFound},
				{op: "pay", wantCode: flashsale.CodeOrderCancelled},
			},
			wantEvents: []string{"order.cancelled"}, wantRemaining: 5, wantSold: 0, wantDB: flashsale.OrderCancelled, buyAgain: true,
		},
		{
			name: "pay past window", setup: "past",
			steps: []step{
				{op: "get", wantStatus: flashsale.OrderPending, wantPayable: false},
				{op: "pay", wantCode: flashsale.CodeOrderExpired},
			},
			wantRemaining: 4, wantSold: 1, wantDB: flashsale.OrderPending, // the worker expires it
		},
		{
			name: "cancel past window expires it", setup: "past",
			steps: []step{
				{op: "cancel", wantCode: flashsale.CodeOrderExpired},
				{op: "cancel", wantCode: flashsale.CodeOrderExpired},
				{op: "get", wantStatus: flashsale.OrderExpired},
				{op: "pay", wantCode: flashsale.CodeOrderExpired},
			},
			wantEvents: []string{"order.expired"}, wantRemaining: 5, wantSold: 0, wantDB: flashsale.OrderExpired, buyAgain: true,
		},
		{
			name: "expired", setup: "expired",
			steps: []step{
				{op: "pay", wantCode: flashsale.CodeOrderExpired},
				{op: "cancel", wantCode: flashsale.CodeOrderExpired},
				{op: "bySale", wantCode: flashsale.CodeNotFound},
			},
			wantRemaining: 5, wantSold: 0, wantDB: flashsale.OrderExpired, buyAgain: true,
		},
		{
			name: "rejected", setup: "rejected",
			steps: []step{
				{op: "get", wantStatus: flashsale.OrderRejected},
				{op: "pay", wantCode: flashsale.CodeOrderCancelled},
				{op: "cancel", wantCode: flashsale.CodeOrderCancelled},
			},
			wantRemaining: 5, wantSold: 0, wantDB: flashsale.OrderRejected, buyAgain: true,
		},
		{
			name: "another user's order", setup: "pending",
			steps: []step{
				{op: "get", other: true, wantCode: flashsale.CodeNotFound},
				{op: "pay", other: true, wantCode: flashsale.CodeNotFound},
				{op: "cancel", other: true, wantCode: flashsale.CodeNotFound},
				{op: "bySale", other: true, wantCode: flashsale.CodeNotFound},
				{op: "get", wantStatus: flashsale.OrderPending, wantPayable: true},
				{op: "bySale", wantStatus: flashsale.OrderPending, wantPayable: true},
			},
			wantRemaining: 4, wantSold: 1, wantDB: flashsale.OrderPending,
		},
		{
			name: "only in Redis", setup: "redisOnly",
			steps: []step{
				{op: "get", wantStatus: flashsale.OrderPending, wantPayable: false},
				{op: "bySale", wantStatus: flashsale.OrderPending, wantPayable: false},
				{op: "pay", wantCode: flashsale.CodeNotPayableYet},
				{op: "cancel", wantCode: flashsale.CodeNotPayableYet},
				{op: "get", other: true, wantCode: flashsale.CodeNotFound},
			},
			wantRemaining: 4, wantSold: 0,
		},
		{
			name: "malformed and unknown ids", setup: "pending",
			steps: []step{
				{op: "get", id: "not-a-uuid", wantCode: flashsale.CodeInvalid},
				{op: "pay", id: "{" + uuid.NewString() + "}", wantCode: flashsale.CodeInvalid},
				{op: "cancel", id: "", wantCode: flashsale.CodeInvalid},
				{op: "get", id: uuid.NewString(), wantCode: flashsale.CodeNotFound},
				{op: "pay", id: uuid.NewString(), wantCode: flashsale.CodeNotFound},
				{op: "cancel", id: uuid.NewString(), wantCode: flashsale.CodeNotFound},
			},
			wantRemaining: 4, wantSold: 1, wantDB: flashsale.OrderPending,
		},
	}
	f := newFixture(t, len(cases), 5)
	ctx := context.Background()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			item := f.sale.Items[i]
			user, other := int64(100+i), int64(9000+i)
			var id string
			var created time.Time
			switch tc.setup {
			case "pending":
				created = pending
				id = f.place(t, user, item.ID, created, flashsale.OrderPending)
			case "past":
				created = pastWindow
				id = f.place(t, user, item.ID, created, flashsale.OrderPending)
			case "expired":
				created = pastWindow
				id = f.place(t, user, item.ID, created, flashsale.OrderExpired)
			case "rejected":
				created = pending
				id = f.place(t, user, item.ID, created, flashsale.OrderRejected)
			case "redisOnly":
				created = t0.Add(-2 * time.Second).Truncate(time.Millisecond)
				id = f.reserve(t, user, item.ID, created)
			}
			for j, st := range tc.steps {
				caller, oid := user, id
				if st.other {
					caller = other
				}
				if st.id != "" || st.wantCode == flashsale.CodeInvalid {
					oid = st.id
				}
				var got flashsale.Order
				var err error
				switch st.op {
				case "get":
					got, err = f.svc.Get(ctx, caller, oid)
				case "bySale":
					got, err = f.svc.BySale(ctx, caller, f.sale.ID)
				case "pay":
					got, err = f.svc.Pay(ctx, caller, oid)
				case "cancel":
					got, err = f.svc.Cancel(ctx, caller, oid)
				}
				if code := flashsale.ErrorCode(err); code != st.wantCode {
					t.Fatalf("step %d %s: code %q (err %v), want %q", j, st.op, code, err, st.wantCode)
				}
				if err != nil {
					continue
				}
				want := flashsale.Order{
					ID: id, SaleID: f.sale.ID, ItemID: item.ID, UserID: user, Status: st.wantStatus,
					PriceCents: item.PriceCents, CreatedAt: created, ExpiresAt: created.Add(window), Payable: st.wantPayable,
				}
				if !got.CreatedAt.Equal(want.CreatedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
					t.Errorf("step %d %s: times %v..%v, want %v..%v", j, st.op, got.CreatedAt, got.ExpiresAt, want.CreatedAt, want.ExpiresAt)
				}
				got.CreatedAt, got.ExpiresAt = want.CreatedAt, want.ExpiresAt
				if got != want {
					t.Errorf("step %d %s:\n got %+v\nwant %+v", j, st.op, got, want)
				}
			}
			if got := f.remaining(t, item.ID); got != tc.wantRemaining {
				t.Errorf("Redis remaining = %d, want %d", got, tc.wantRemaining)
			}
			if got := f.sold(t, item.ID); got != tc.wantSold {
				t.Errorf("items.sold = %d, want %d", got, tc.wantSold)
			}
			if tc.wantDB != "" {
				if got := f.status(t, id); got != tc.wantDB {
					t.Errorf("database status = %s, want %s", got, tc.wantDB)
				}
			}
			if got := f.events(t, id); !slices.Equal(got, tc.wantEvents) {
				t.Errorf("events = %v, want %v", got, tc.wantEvents)
			}
			// A late drain of the outbox gives nothing back twice.
			if _, err := f.svc.DrainReturns(ctx, 0, 100); err != nil {
				t.Fatal(err)
			}
			if got := f.remaining(t, item.ID); got != tc.wantRemaining {
				t.Errorf("after drain: Redis remaining = %d, want %d", got, tc.wantRemaining)
			}
			if tc.buyAgain {
				f.reserve(t, user, item.ID, t0)
				if got := f.remaining(t, item.ID); got != tc.wantRemaining-1 {
					t.Errorf("after buying again: remaining = %d, want %d", got, tc.wantRemaining-1)
				}
			}
		})
	}
	if n := f.outbox(t); n != 0 {
		t.Errorf("stock_returns has %d rows, want 0", n)
	}
}

// deadStore is a stock store on a redis-server that has been stopped.
func deadStore(t *testing.T) *redisstock.Store {
	t.Helper()
	r := testenv.NewRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	return redisstock.New(rdb)
}

// TestCancelRedisDownLeavesOutbox: the cancel commits while Redis is
// unreachable for the release; the outbox row stays and a later drain
// returns the unit exactly once.
func TestCancelRedisDownLeavesOutbox(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 1, 3)
	item := f.sale.Items[0].ID
	id := f.place(t, 1, item, t0.Add(-time.Minute), flashsale.OrderPending)

	broken := f.service(deadStore(t), func() time.Time { return t0 })
	// Stored orders read without Redis; a lookup that needs Redis is
	// UNAVAILABLE, not NOT_FOUND.
	if got, err := broken.Get(ctx, 1, id); err != nil || got.Status != flashsale.OrderPending {
		t.Fatalf("Get with Redis down = %v, %v; want PENDING", got.Status, err)
	}
	if _, err := broken.Get(ctx, 1, uuid.NewString()); flashsale.ErrorCode(err) != flashsale.CodeUnavailable {
		t.Fatalf("Get of an unknown order with Redis down: %v, want UNAVAILABLE", err)
	}
	got, err := broken.Cancel(ctx, 1, id)
	if err != nil || got.Status != flashsale.OrderCancelled {
		t.Fatalf("Cancel = %v, %v; want CANCELLED", got.Status, err)
	}
	if n := f.outbox(t); n != 1 {
		t.Fatalf("outbox rows = %d, want 1", n)
	}
	if r := f.remaining(t, item); r != 2 {
		t.Fatalf("remaining before drain = %d, want 2", r)
	}
	// Draining through dead Redis settles nothing and keeps the row.
	if n, err := broken.DrainReturns(ctx, 0, 10); err == nil || n != 0 {
		t.Fatalf("drain on dead Redis = %d, %v; want 0 and an error", n, err)
	}
	// Not yet stale: a drain asking for rows older than a minute skips it.
	if n, err := f.svc.DrainReturns(ctx, time.Minute, 10); err != nil || n != 0 {
		t.Fatalf("drain of young rows = %d, %v; want 0, nil", n, err)
	}
	// Two drainers at once: the row is settled once, the unit back once.
	var wg sync.WaitGroup
	counts := make([]int, 2)
	for i := range counts {
		wg.Go(func() {
			n, err := f.svc.DrainReturns(ctx, 0, 10)
			if err != nil {
				t.Error(err)
			}
			counts[i] = n
		})
	}
	wg.Wait()
	if counts[0]+counts[1] < 1 {
		t.Fatalf("drained %v rows, want the one row settled", counts)
	}
	if r := f.remaining(t, item); r != 3 {
		t.Fatalf("remaining after drain = %d, want 3", r)
	}
	if n, err := f.svc.DrainReturns(ctx, 0, 10); err != nil || n != 0 {
		t.Fatalf("second drain = %d, %v; want 0", n, err)
	}
	if r, n := f.remaining(t, item), f.outbox(t); r != 3 || n != 0 {
		t.Fatalf("remaining %d, outbox %d; want 3, 0", r, n)
	}
	if got, err := f.svc.Cancel(ctx, 1, id); err != nil || got.Status != flashsale.OrderCancelled {
		t.Fatalf("repeat Cancel = %v, %v", got.Status, err)
	}
	if r := f.remaining(t, item); r != 3 {
		t.Fatalf("remaining after repeat cancel = %d, want 3", r)
	}
}

// TestConcurrentPayCancel: many goroutines paying and cancelling one order
// resolve to one outcome; stock comes back at most once.
func TestConcurrentPayCancel(t *testing.T) {
	ctx := context.Background()
	const rounds = 20
	f := newFixture(t, 1, rounds)
	item := f.sale.Items[0].ID
	paid := 0
	for r := range rounds {
		user := int64(r + 1)
		id := f.place(t, user, item, t0.Add(-time.Minute), flashsale.OrderPending)
		var wg sync.WaitGroup
		start := make(chan struct{})
		codes := make([]flashsale.Code, 6)
		for g := range codes {
			wg.Go(func() {
				<-start
				var err error
				if g%2 == 0 {
					_, err = f.svc.Pay(ctx, user, id)
				} else {
					_, err = f.svc.Cancel(ctx, user, id)
				}
				codes[g] = flashsale.ErrorCode(err)
			})
		}
		close(start)
		wg.Wait()
		st := f.status(t, id)
		for g, code := range codes {
			var want flashsale.Code
			switch {
			case st == flashsale.OrderPaid && g%2 == 1:
				want = flashsale.CodeOrderPaid
			case st == flashsale.OrderCancelled && g%2 == 0:
				want = flashsale.CodeOrderCancelled
			case st != flashsale.OrderPaid && st != flashsale.OrderCancelled:
				t.Fatalf("round %d: status %s", r, st)
			}
			if code != want {
				t.Errorf("round %d (%s): goroutine %d got %q, want %q", r, st, g, code, want)
			}
		}
		if got, want := f.events(t, id), []string{"order." + strings.ToLower(string(st))}; !slices.Equal(got, want) {
			t.Errorf("round %d: events %v, want %v (one, of the winner)", r, got, want)
		}
		if st == flashsale.OrderPaid {
			paid++
		}
	}
	if got, want := f.remaining(t, item), int64(rounds-paid); got != want {
		t.Errorf("remaining = %d, want %d (paid %d)", got, want, paid)
	}
	if got, want := f.sold(t, item), int64(paid); got != want {
		t.Errorf("sold = %d, want %d", got, want)
	}
	t.Logf("paid %d of %d", paid, rounds)
}

func TestParseID(t *testing.T) {
	good := uuid.NewString()
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{good, good, true},
		{fmt.Sprintf("%X", uuid.MustParse(good)), "", false}, // 32 hex digits without dashes
		{"6BA7B810-9DAD-11D1-80B4-00C04FD430C8", "6ba7b810-9dad-11d1-80b4-00c04fd430c8", true},
		{"urn:uuid:" + good, "", false},
		{"", "", false},
		{"6ba7b810-9dad-11d1-80b4-00c04fd430cz", "", false},
	}
	for _, tt := range tests {
		got, err := orders.ParseID(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseID(%q) = %q, %v; want %q ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func FuzzParseID(f *testing.F) {
	f.Add(uuid.NewString())
	f.Add("not-a-uuid")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := orders.ParseID(s)
		if err != nil {
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid {
				t.Fatalf("code %q", flashsale.ErrorCode(err))
			}
			return
		}
		if again, err := orders.ParseID(id); err != nil || again != id {
			t.Fatalf("canonical %q does not round-trip: %q, %v", id, again, err)
		}
	})
}
