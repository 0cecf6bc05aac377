package writer

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

func TestRedeliveredMessageWritesOneOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 10)
	item := sale.Items[0]
	m := e.reserve(t, item, 42)
	e.publish(t, m)
	e.publish(t, m) // the same message again, in its own produce request

	r := e.start(t, Config{PaymentWindow: 7 * time.Minute})
	waitHandled(t, r.w, 2)

	rows := orderRows(t, e.pool, sale.ID)
	if len(rows) != 1 {
		t.Fatalf("orders: got %d rows, want 1", len(rows))
	}
	got := rows[m.OrderID]
	if got.status != string(flashsale.OrderPending) || got.userID != 42 {
		t.Errorf("order row: got %+v, want PENDING of user 42", got)
	}
	if want := time.UnixMilli(m.CreatedAtMs); !got.created.Equal(want) || !got.expires.Equal(want.Add(7*time.Minute)) {
		t.Errorf("times: got created %v expires %v, want %v and +7m", got.created, got.expires, want)
	}
	if n := sold(t, e.pool, item.ID); n != 1 {
		t.Errorf("sold: got %d, want 1", n)
	}
	if evs := wantEvents(t, e.pool, m.OrderID, "order.pending"); len(evs) == 1 {
		if ev := evs[0]; ev.status != "PENDING" || ev.userID != "42" || !ev.at.Equal(time.UnixMilli(m.CreatedAtMs)) {
			t.Errorf("pending event: got %+v, want PENDING of user \"42\" at the order's creation", ev)
		}
	}
	if c, want := r.w.counts(), (counts{written: 1, duplicate: 1}); c != want {
		t.Errorf("counts: got %+v, want %+v", c, want)
	}
	// The first batch holds new orders only (one round trip), unless the
	// redelivery came in the same poll (the general path); a later
	// redelivery alone always takes the general path.
	oneTrip, general := value(r.w.m.oneTrip), value(r.w.m.general)
	if oneTrip+general < 1 {
		t.Errorf("transactions: %v one round trip, %v general; want at least one", oneTrip, general)
	}
	if n := pendingCount(t, e.rdb, sale.ID); n != 0 {
		t.Errorf("pending members in Redis: got %d, want 0 (confirmed)", n)
	}
	if _, ok, _ := e.stock.Buyer(context.Background(), sale.ID, 42); !ok {
		t.Error("the buyer record must stay after the confirm")
	}

	// The same message once more, in a later batch: still one row.
	e.publish(t, m)
	waitHandled(t, r.w, 3)
	if n := len(orderRows(t, e.pool, sale.ID)); n != 1 {
		t.Errorf("orders after a later redelivery: got %d, want 1", n)
	}
	if n := sold(t, e.pool, item.ID); n != 1 {
		t.Errorf("sold after a later redelivery: got %d, want 1", n)
	}
	wantEvents(t, e.pool, m.OrderID, "order.pending") // a redelivery is no change
	if g := value(r.w.m.general); g < general+1 {
		t.Errorf("general-path transactions %v after a lone redelivery, want more than %v", g, general)
	}
}

func TestKilledBetweenDatabaseAndOffsetCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 100)
	item := sale.Items[0]
	const n = 30
	var msgs []flashsale.OrderPlaced
	for u := range n {
		msgs = append(msgs, e.reserve(t, item, int64(1000+u)))
	}
	e.publish(t, msgs...)

	r1 := e.start(t, Config{BatchSize: 10, afterDBCommit: func() error { return errTestKill }})
	if err := r1.wait(t); !errors.Is(err, errTestKill) {
		t.Fatalf("Run: got %v, want the kill", err)
	}
	r1.w.Close()
	firstRows := len(orderRows(t, e.pool, sale.ID))
	if firstRows == 0 {
		t.Fatal("the killed writer committed nothing to the database")
	}
	if off := committed(t, e.kafka.Brokers, "flashsale-writer"); off != 0 {
		t.Fatalf("committed offsets after the kill: got %d, want 0", off)
	}

	// A new writer in the same group re-reads everything.
	r2 := e.start(t, Config{BatchSize: 10})
	waitHandled(t, r2.w, n)
	rows := orderRows(t, e.pool, sale.ID)
	if len(rows) != n {
		t.Errorf("orders: got %d, want %d", len(rows), n)
	}
	for _, m := range msgs {
		if rows[m.OrderID].status != "PENDING" {
			t.Errorf("order %s: got status %q, want PENDING", m.OrderID, rows[m.OrderID].status)
		}
	}
	if got := sold(t, e.pool, item.ID); got != n {
		t.Errorf("sold: got %d, want %d", got, n)
	}
	if c := r2.w.counts(); c.duplicate != firstRows || c.written != n-firstRows {
		t.Errorf("second writer: got %+v, want %d duplicates and %d written", c, firstRows, n-firstRows)
	}
	if p := pendingCount(t, e.rdb, sale.ID); p != 0 {
		t.Errorf("pending members: got %d, want 0", p)
	}
}

func TestDatabaseRefusesWhatRedisAccepted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		killed bool // a first writer dies between the database commit and the Redis release
	}{
		{"one run", false},
		{"killed after the database commit", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testDatabaseRefuses(t, c.killed)
		})
	}
}

func testDatabaseRefuses(t *testing.T, killed bool) {
	e := newEnv(t)
	sale := e.newSale(t, 5)
	item := sale.Items[0]
	// Redis believes there are 8 units: loaded too high by hand.
	if err := e.stock.Load(context.Background(), sale.ID, map[int64]int64{item.ID: 8}); err != nil {
		t.Fatal(err)
	}
	var msgs []flashsale.OrderPlaced
	for u := range 8 {
		msgs = append(msgs, e.reserve(t, item, int64(100+u)))
	}
	e.publish(t, msgs...) // one key: one partition, in this order
	e.publish(t, msgs[7]) // and a rejected one delivered twice

	if killed {
		r1 := e.start(t, Config{afterDBCommit: func() error { return errTestKill }})
		if err := r1.wait(t); !errors.Is(err, errTestKill) {
			t.Fatalf("Run: got %v, want the kill", err)
		}
		r1.w.Close()
	}
	r := e.start(t, Config{})
	waitHandled(t, r.w, 9)

	rows := orderRows(t, e.pool, sale.ID)
	for i, m := range msgs {
		want := orderRow{status: "PENDING"}
		if i >= 5 {
			want = orderRow{status: "REJECTED", reason: ReasonSoldOut}
		}
		if got := rows[m.OrderID]; got.status != want.status || got.reason != want.reason {
			t.Errorf("order %d: got %s/%q, want %s/%q", i, got.status, got.reason, want.status, want.reason)
		}
	}
	if got := sold(t, e.pool, item.ID); got != 5 {
		t.Errorf("sold: got %d, want 5", got)
	}
	// One event per order, whatever was replayed: PENDING for the stored,
	// REJECTED with its reason for the refused (msgs[7] came twice).
	for i, m := range msgs {
		if i < 5 {
			wantEvents(t, e.pool, m.OrderID, "order.pending")
			continue
		}
		if evs := wantEvents(t, e.pool, m.OrderID, "order.rejected"); len(evs) == 1 && (evs[0].status != "REJECTED" || evs[0].reason != ReasonSoldOut) {
			t.Errorf("order %d: rejected event %+v, want status REJECTED, reason %s", i, evs[0], ReasonSoldOut)
		}
	}
	if c := r.w.counts(); c.rejected != 3 || c.written+c.duplicate != 6 || (!killed && c.written != 5) {
		t.Errorf("counts: got %+v, want 3 rejected, 6 written or duplicate (5 written in one run)", c)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM stock_returns`); n != 0 {
		t.Errorf("stock_returns rows left: got %d, want 0 (released and deleted)", n)
	}
	ctx := context.Background()
	for _, m := range msgs[5:] {
		if _, ok, _ := e.stock.Buyer(ctx, sale.ID, m.UserID); ok {
			t.Errorf("user %d: buyer record still there after the rejection", m.UserID)
		}
		again, err := e.stock.Release(ctx, sale.ID, m.UserID, m.ItemID, m.OrderID)
		if err != nil || again {
			t.Errorf("user %d: a second release gave a unit back (%v, %v)", m.UserID, again, err)
		}
	}
	left, err := e.stock.Remaining(ctx, sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	if left[item.ID] != 3 { // 8 loaded - 8 reserved + 3 released once
		t.Errorf("Redis remaining: got %d, want 3", left[item.ID])
	}
	if p := pendingCount(t, e.rdb, sale.ID); p != 0 {
		t.Errorf("pending members: got %d, want 0", p)
	}

	dl := deadLetters(t, e.kafka.Brokers, 3)
	want := map[string]bool{msgs[5].OrderID: true, msgs[6].OrderID: true, msgs[7].OrderID: true}
	for _, rec := range dl {
		var v struct {
			flashsale.OrderPlaced
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(rec.Value, &v); err != nil {
			t.Fatalf("dead letter %q: %v", rec.Value, err)
		}
		if !want[v.OrderID] || v.Reason != ReasonSoldOut || v.ItemID != item.ID || v.UserID == 0 {
			t.Errorf("dead letter: got %s, want one of the 3 rejected orders with reason SOLD_OUT, once", rec.Value)
		}
		delete(want, v.OrderID)
	}
}

func TestUserWithTwoLiveOrdersInOneSale(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 10)
	item := sale.Items[0]
	ctx := context.Background()
	loseBuyer := func(userID int64) { // Redis forgets the user's reservation
		t.Helper()
		if err := e.rdb.HDel(ctx, lua.BuyersKey(sale.ID), strconv.FormatInt(userID, 10)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	a1 := e.reserve(t, item, 1)
	a2 := e.reserve(t, item, 2)
	loseBuyer(2)
	b2 := e.reserve(t, item, 2) // a second live order of user 2
	a3 := e.reserve(t, item, 3)
	e.publish(t, a1, a2, b2, a3) // one batch: split around b2

	r := e.start(t, Config{})
	waitHandled(t, r.w, 4)
	rows := orderRows(t, e.pool, sale.ID)
	for _, c := range []struct {
		name   string
		m      flashsale.OrderPlaced
		status string
		reason string
	}{
		{"user 1", a1, "PENDING", ""},
		{"user 2 first", a2, "PENDING", ""},
		{"user 2 second", b2, "REJECTED", ReasonAlreadyPurchased},
		{"user 3", a3, "PENDING", ""},
	} {
		if got := rows[c.m.OrderID]; got.status != c.status || got.reason != c.reason {
			t.Errorf("%s: got %s/%q, want %s/%q", c.name, got.status, got.reason, c.status, c.reason)
		}
	}
	if got := sold(t, e.pool, item.ID); got != 3 {
		t.Errorf("sold: got %d, want 3", got)
	}

	// Later, in a batch of its own: user 3 again.
	loseBuyer(3)
	b3 := e.reserve(t, item, 3)
	e.publish(t, b3)
	waitHandled(t, r.w, 5)
	if got := orderRows(t, e.pool, sale.ID)[b3.OrderID]; got.status != "REJECTED" || got.reason != ReasonAlreadyPurchased {
		t.Errorf("user 3 second: got %s/%q, want REJECTED/ALREADY_PURCHASED", got.status, got.reason)
	}
	if got := sold(t, e.pool, item.ID); got != 3 {
		t.Errorf("sold: got %d, want 3", got)
	}
	left, err := e.stock.Remaining(ctx, sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	if left[item.ID] != 7 { // 10 - 5 reserved + 2 rejected
		t.Errorf("Redis remaining: got %d, want 7", left[item.ID])
	}
	if c, want := r.w.counts(), (counts{written: 3, rejected: 2}); c != want {
		t.Errorf("counts: got %+v, want %+v", c, want)
	}
	dl := deadLetters(t, e.kafka.Brokers, 2)
	for _, rec := range dl {
		if h := header(rec, "reason"); h != ReasonAlreadyPurchased {
			t.Errorf("dead letter reason header: got %q, want %q", h, ReasonAlreadyPurchased)
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func TestUndecodableRecordIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 10)
	item := sale.Items[0]
	key := []byte(strconv.FormatInt(item.ID, 10))
	bad := [][]byte{
		[]byte("not json"),
		[]byte(`{"orderId":"x","saleId":1,"itemId":2,"userId":3}`),
	}
	e.produce(t, &kgo.Record{Topic: flashsale.TopicOrders, Key: key, Value: bad[0]})
	good := e.reserve(t, item, 7)
	e.publish(t, good)
	e.produce(t, &kgo.Record{Topic: flashsale.TopicOrders, Key: key, Value: bad[1]})

	r := e.start(t, Config{})
	waitHandled(t, r.w, 3)
	if c, want := r.w.counts(), (counts{written: 1, undecodable: 2}); c != want {
		t.Errorf("counts: got %+v, want %+v", c, want)
	}
	if got := orderRows(t, e.pool, sale.ID)[good.OrderID].status; got != "PENDING" {
		t.Errorf("good order: got %q, want PENDING", got)
	}
	dl := deadLetters(t, e.kafka.Brokers, 2)
	seen := map[string]bool{}
	for _, rec := range dl {
		seen[string(rec.Value)] = true
		if h := header(rec, "reason"); h != ReasonUndecodable {
			t.Errorf("reason header: got %q, want %q", h, ReasonUndecodable)
		}
	}
	for _, b := range bad {
		if !seen[string(b)] {
			t.Errorf("dead letters: %q missing", b)
		}
	}

	// The writer goes on, and its offsets are past the bad records.
	next := e.reserve(t, item, 8)
	e.publish(t, next)
	waitHandled(t, r.w, 4)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if off := committed(t, e.kafka.Brokers, "flashsale-writer"); off != 4 {
		t.Errorf("committed offsets: got %d, want 4", off)
	}
}

func TestGracefulShutdownCommitsTheBatchInHand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 100)
	item := sale.Items[0]
	const n = 50
	var msgs []flashsale.OrderPlaced
	for u := range n {
		msgs = append(msgs, e.reserve(t, item, int64(1+u)))
	}
	e.publish(t, msgs...)

	var r *running
	var batches atomic.Int32
	ready := make(chan struct{})
	r = e.start(t, Config{BatchSize: 10, afterDBCommit: func() error {
		if batches.Add(1) == 1 {
			<-ready
			r.cancel() // SIGTERM while the first batch is between DB and Kafka
		}
		return nil
	}})
	close(ready)
	if err := r.wait(t); err != nil {
		t.Fatalf("Run: got %v, want nil on shutdown", err)
	}
	r.w.Close()
	written := countRows(t, e.pool, `SELECT count(*) FROM orders WHERE sale_id = $1`, sale.ID)
	if written == 0 || written >= n {
		t.Fatalf("orders after shutdown: got %d, want the first batch only", written)
	}
	if off := committed(t, e.kafka.Brokers, "flashsale-writer"); off != int64(written) {
		t.Errorf("committed offsets: got %d, want %d (the batch in hand)", off, written)
	}
	if p := pendingCount(t, e.rdb, sale.ID); p != int64(n-written) {
		t.Errorf("pending members: got %d, want %d", p, n-written)
	}

	// The next writer starts after the committed batch: no duplicates.
	r2 := e.start(t, Config{BatchSize: 10})
	waitHandled(t, r2.w, n-written)
	if c, want := r2.w.counts(), (counts{written: n - written}); c != want {
		t.Errorf("second writer: got %+v, want %+v", c, want)
	}
	if got := sold(t, e.pool, item.ID); got != n {
		t.Errorf("sold: got %d, want %d", got, n)
	}
}

func TestBatchSplitKeepsGoodRecordsAcrossItems(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 3, 50)
	small, big := sale.Items[0], sale.Items[1]
	ctx := context.Background()
	if err := e.stock.Load(ctx, sale.ID, map[int64]int64{small.ID: 6}); err != nil {
		t.Fatal(err)
	}
	var msgs []flashsale.OrderPlaced
	for u := range 40 {
		it := big
		if u%5 == 0 && u < 30 { // 6 orders for the small item, 3 too many
			it = small
		}
		msgs = append(msgs, e.reserve(t, it, int64(1+u)))
	}
	e.publish(t, msgs...)
	r := e.start(t, Config{})
	waitHandled(t, r.w, 40)
	if got := sold(t, e.pool, small.ID); got != 3 {
		t.Errorf("small item sold: got %d, want 3", got)
	}
	if got := sold(t, e.pool, big.ID); got != 34 {
		t.Errorf("big item sold: got %d, want 34", got)
	}
	if c, want := r.w.counts(), (counts{written: 37, rejected: 3}); c != want {
		t.Errorf("counts: got %+v, want %+v", c, want)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM orders WHERE status = 'REJECTED' AND item_id = $1`, small.ID); n != 3 {
		t.Errorf("rejected orders of the small item: got %d, want 3", n)
	}
}

func TestUnknownItemIsDeadLetteredWithoutRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 10)
	other := e.newSale(t, 10)
	m := e.reserve(t, sale.Items[0], 5)
	m.ItemID = other.Items[0].ID // an item of another sale
	good := e.reserve(t, other.Items[0], 6)
	e.publish(t, good, m) // one batch, one item id, two sales
	r := e.start(t, Config{})
	waitHandled(t, r.w, 2)
	if c, want := r.w.counts(), (counts{written: 1, rejected: 1}); c != want {
		t.Errorf("counts: got %+v, want %+v", c, want)
	}
	if n := countRows(t, e.pool, `SELECT count(*) FROM orders`); n != 1 {
		t.Errorf("orders: got %d, want 1", n)
	}
	if got := sold(t, e.pool, other.Items[0].ID); got != 1 {
		t.Errorf("other sale's item sold: got %d, want 1", got)
	}
	if p := pendingCount(t, e.rdb, sale.ID); p != 1 {
		t.Errorf("pending members: got %d, want 1 (left to the reconciler)", p)
	}
	dl := deadLetters(t, e.kafka.Brokers, 1)
	if h := header(dl[0], "reason"); h != ReasonUnknownItem {
		t.Errorf("reason: got %q, want %q", h, ReasonUnknownItem)
	}
}

func TestDecode(t *testing.T) {
	now := func() time.Time { return time.UnixMilli(1_700_000_000_000) }
	const id = "0b7e8f6a-3c1d-4e2f-9a8b-7c6d5e4f3a2b"
	for _, c := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"valid", `{"orderId":"` + id + `","saleId":1,"itemId":2,"userId":3,"priceCents":5,"createdAtMs":1700000000001}`, true},
		{"no createdAt uses now", `{"orderId":"` + id + `","saleId":1,"itemId":2,"userId":3}`, true},
		{"not json", `nope`, false},
		{"null", `null`, false},
		{"bad uuid", `{"orderId":"x","saleId":1,"itemId":2,"userId":3}`, false},
		{"braced uuid", `{"orderId":"{` + id + `}","saleId":1,"itemId":2,"userId":3}`, false},
		{"no sale", `{"orderId":"` + id + `","itemId":2,"userId":3}`, false},
		{"negative price", `{"orderId":"` + id + `","saleId":1,"itemId":2,"userId":3,"priceCents":-1}`, false},
		{"string user", `{"orderId":"` + id + `","saleId":1,"itemId":2,"userId":"3"}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := decode([]byte(c.in), now, time.Minute)
			if (err == nil) != c.ok {
				t.Fatalf("decode: got err %v, want ok=%v", err, c.ok)
			}
			if err == nil && !o.expires.Equal(o.created.Add(time.Minute)) {
				t.Errorf("expires: got %v, want created + 1m", o.expires)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"orderId":"0b7e8f6a-3c1d-4e2f-9a8b-7c6d5e4f3a2b","saleId":1,"itemId":2,"userId":3,"priceCents":5,"createdAtMs":1}`))
	f.Add([]byte(`{}`))
	now := time.Now
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := decode(b, now, time.Minute)
		if err != nil {
			return
		}
		if o.msg.SaleID <= 0 || o.msg.ItemID <= 0 || o.msg.UserID <= 0 || o.msg.PriceCents < 0 || len(o.msg.OrderID) != 36 {
			t.Fatalf("accepted a bad message: %+v", o.msg)
		}
		// The dead-letter form round-trips.
		var back flashsale.OrderPlaced
		if err := json.Unmarshal(deadLetterValue(o.msg, "X"), &back); err != nil || back != o.msg {
			t.Fatalf("dead-letter value: %v, %+v", err, back)
		}
	})
}

// TestNewOrdersInOneRoundTrip: batches of new orders within stock take the
// one-round-trip path (BEGIN, insert and update sent together), never the
// general one, and write every order.
func TestNewOrdersInOneRoundTrip(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 10)
	for u := int64(1); u <= 5; u++ {
		e.publish(t, e.reserve(t, sale.Items[0], u))
	}
	r := e.start(t, Config{})
	waitHandled(t, r.w, 5)
	rows := orderRows(t, e.pool, sale.ID)
	if n := len(rows); n != 5 {
		t.Fatalf("orders: got %d rows, want 5", n)
	}
	if n := sold(t, e.pool, sale.Items[0].ID); n != 5 {
		t.Errorf("sold: got %d, want 5", n)
	}
	for id := range rows {
		wantEvents(t, e.pool, id, "order.pending")
	}
	if one, gen := value(r.w.m.oneTrip), value(r.w.m.general); one < 1 || gen != 0 {
		t.Errorf("transactions: %v one round trip, %v general; want every batch on the one-round-trip path", one, gen)
	}
}

// Two batches' transactions run at once: while the first waits for a lock,
// the second is written; but what follows a commit goes in poll order, so
// nothing of the second is confirmed or committed before the first is.
func TestBatchesInFlightFinishInPollOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 10, 10)
	itemA, itemB := sale.Items[0], sale.Items[1]
	ctx := context.Background()

	// Hold item A's row: the first batch's insert (its foreign-key check)
	// or update waits for it.
	lock, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := lock.Exec(ctx, `SELECT 1 FROM items WHERE id = $1 FOR UPDATE`, itemA.ID); err != nil {
		t.Fatal(err)
	}

	r := e.start(t, Config{BatchSize: 1, InFlight: 2})
	mA := e.reserve(t, itemA, 1)
	e.publish(t, mA)
	waitFor(t, "the first batch waiting for the lock", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 1
	})
	mB := e.reserve(t, itemB, 2)
	e.publish(t, mB)
	waitFor(t, "the second batch's order in the database", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM orders WHERE id = $1`, mB.OrderID) == 1
	})
	if n := countRows(t, e.pool, `SELECT count(*) FROM orders WHERE id = $1`, mA.OrderID); n != 0 {
		t.Fatalf("the first batch's order is in the database (%d rows) while its item is locked", n)
	}
	if n := pendingCount(t, e.rdb, sale.ID); n != 2 {
		t.Errorf("pending members in Redis while the first batch waits: got %d, want 2 (no confirm out of order)", n)
	}
	if n := committed(t, e.kafka.Brokers, "flashsale-writer"); n != 0 {
		t.Errorf("committed offsets while the first batch waits: got %d, want 0", n)
	}
	if h := r.w.handled(); h != 0 {
		t.Errorf("finished records while the first batch waits: got %d, want 0", h)
	}

	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitHandled(t, r.w, 2)
	if n := len(orderRows(t, e.pool, sale.ID)); n != 2 {
		t.Errorf("orders: got %d, want 2", n)
	}
	if a, b := sold(t, e.pool, itemA.ID), sold(t, e.pool, itemB.ID); a != 1 || b != 1 {
		t.Errorf("sold: got %d and %d, want 1 and 1", a, b)
	}
	if n := pendingCount(t, e.rdb, sale.ID); n != 0 {
		t.Errorf("pending members in Redis at the end: got %d, want 0", n)
	}
	if n := committed(t, e.kafka.Brokers, "flashsale-writer"); n != 2 {
		t.Errorf("committed offsets at the end: got %d, want 2", n)
	}
}

// A steady stream of orders, one produce request each, is written in
// batches that gather what arrived within the fetch wait, not one or two
// orders a transaction (a fetch answered by the first record to arrive).
func TestSteadyStreamIsBatched(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 1000)
	item := sale.Items[0]
	r := e.start(t, Config{})
	const n = 200
	for i := range n {
		e.publish(t, e.reserve(t, item, int64(i+1)))
		time.Sleep(time.Millisecond)
	}
	waitHandled(t, r.w, n)
	batches := histogramCount(t, r.w.m.batchRecords)
	// Sent over 0.2 s or more, the stream fits in a few 50 ms windows;
	// fetches answered at the first record would make a batch of each
	// order or two.
	if batches > n/4 {
		t.Errorf("%d orders in %d batches, want at most %d", n, batches, n/4)
	}
	t.Logf("%d orders in %d batches", n, batches)
	if got := sold(t, e.pool, item.ID); got != n {
		t.Errorf("sold: got %d, want %d", got, n)
	}
}

// A second writer joins the group while orders stream in: the first lets
// the rebalance through (it stops polling and finishes the batches in
// hand), the second takes partitions and writes, and every order is
// written exactly once.
func TestRebalanceWhileBatchesInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000)
	a := e.start(t, Config{BatchSize: 5})
	var b *running
	deadline := time.Now().Add(30 * time.Second)
	n := 0
	for b == nil || b.w.handled() == 0 || n < 200 {
		if time.Now().After(deadline) {
			t.Fatalf("the second writer handled nothing after %d orders", n)
		}
		item := sale.Items[n%len(sale.Items)]
		n++
		e.publish(t, e.reserve(t, item, int64(n)))
		if n == 50 {
			b = e.start(t, Config{BatchSize: 5})
		}
		time.Sleep(2 * time.Millisecond)
	}
	waitFor(t, "every order in the database", func() bool {
		return countRows(t, e.pool, `SELECT count(*) FROM orders WHERE sale_id = $1`, sale.ID) == n
	})
	waitFor(t, "every order confirmed in Redis", func() bool { return pendingCount(t, e.rdb, sale.ID) == 0 })
	var soldAll int64
	for _, it := range sale.Items {
		soldAll += sold(t, e.pool, it.ID)
	}
	if soldAll != int64(n) {
		t.Errorf("sold: got %d, want %d", soldAll, n)
	}
	ca, cb := a.w.counts(), b.w.counts()
	if ca.written+cb.written != n || ca.rejected+cb.rejected != 0 {
		t.Errorf("counts: first %+v, second %+v; want %d written in all", ca, cb, n)
	}
	t.Logf("%d orders: first writer %+v, second %+v", n, ca, cb)
}
