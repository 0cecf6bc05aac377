package events

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// lifecycle is the event sequence the tests give each order.
var lifecycle = []flashsale.OrderStatus{flashsale.OrderPending, flashsale.OrderPaid}

// appendEvents writes, for each order, its lifecycle events in order, each
// in its own transaction, and returns the order ids.
func appendEvents(t testing.TB, pool *pgxpool.Pool, orders int) []string {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, orders)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	for _, st := range lifecycle {
		for i, id := range ids {
			ev := Event{Type: TypeFor(st), OccurredAt: time.Now(), OrderID: id, SaleID: 1, ItemID: 1001,
				UserID: int64(i + 1), Status: st, PriceCents: 100}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return Append(ctx, tx, ev) }); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ids
}

// published is one record of the events topic.
type published struct {
	partition int32
	offset    int64
	key       string
	eventID   int64
	typ       string
	ev        Event
}

// readTopic reads every record of the events topic, from the start to its
// end now.
func readTopic(t testing.TB, brokers []string) []published {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, flashsale.TopicOrderEvents)
	if err != nil || ends.Error() != nil {
		t.Fatalf("end offsets: %v %v", err, ends.Error())
	}
	from := map[int32]kgo.Offset{}
	left := 0
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			from[o.Partition] = kgo.NewOffset().AtStart()
			end[o.Partition] = o.Offset
			left++
		}
	})
	if left == 0 {
		return nil
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{flashsale.TopicOrderEvents: from}))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var out []published
	for left > 0 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading the topic: %v (%d partitions left)", ctx.Err(), left)
		}
		fs.EachRecord(func(rec *kgo.Record) {
			if rec.Offset >= end[rec.Partition] {
				return
			}
			p := published{partition: rec.Partition, offset: rec.Offset, key: string(rec.Key)}
			for _, h := range rec.Headers {
				switch h.Key {
				case HeaderEventID:
					p.eventID, _ = strconv.ParseInt(string(h.Value), 10, 64)
				case HeaderEventType:
					p.typ = string(h.Value)
				}
			}
			if err := json.Unmarshal(rec.Value, &p.ev); err != nil {
				t.Errorf("record %d/%d: %v: %s", rec.Partition, rec.Offset, err, rec.Value)
			}
			out = append(out, p)
			if rec.Offset+1 == end[rec.Partition] {
				left--
			}
		})
	}
	return out
}

// checkExactlyOnce checks that recs carry every event of the outbox once,
// keyed by order, each order's events in one partition in id order.
func checkExactlyOnce(t testing.TB, pool *pgxpool.Pool, recs []published) {
	t.Helper()
	var want []int64
	rows, err := pool.Query(context.Background(), `SELECT id FROM order_events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	want, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]int{}
	last := map[string]published{}
	for _, r := range recs {
		seen[r.eventID]++
		if r.ev.EventID != r.eventID || r.ev.OrderID != r.key || string(r.ev.Type) != r.typ || r.ev.Version != Version {
			t.Errorf("record %d/%d: header id %d type %s key %s, body %+v", r.partition, r.offset, r.eventID, r.typ, r.key, r.ev)
		}
		if p, ok := last[r.key]; ok {
			if p.partition != r.partition {
				t.Errorf("order %s: events in partitions %d and %d", r.key, p.partition, r.partition)
			}
			if p.eventID >= r.eventID {
				t.Errorf("order %s: event %d after %d", r.key, r.eventID, p.eventID)
			}
		}
		last[r.key] = r
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("event %d published %d times, want 1", id, seen[id])
		}
		delete(seen, id)
	}
	for id, n := range seen {
		t.Errorf("record of event %d (%d times) that the outbox does not hold", id, n)
	}
	if t.Failed() {
		t.Logf("%d events, %d records", len(want), len(recs))
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, 60*time.Second, cond)
}

func unpublished(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	return countRows(t, pool, `SELECT count(*) FROM order_events WHERE published_at IS NULL`)
}

func gauge(t testing.TB, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func counter(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// runRelay runs r until the test ends.
func runRelay(t testing.TB, r *Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Relay.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newTestRelay(t testing.TB, pool *pgxpool.Pool, k *testenv.Kafka, cfg RelayConfig) *Relay {
	t.Helper()
	cfg.Brokers = k.Brokers
	if cfg.Interval == 0 {
		cfg.Interval = 20 * time.Millisecond
	}
	r, err := NewRelay(cfg, pool, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRelayPublishesEveryEventOnceInOrder(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	k := testenv.NewKafka(t)
	orders := appendEvents(t, pool, 40)
	r := newTestRelay(t, pool, k, RelayConfig{Batch: 7})
	runRelay(t, r)
	waitFor(t, "every event published", func() bool { return unpublished(t, pool) == 0 })
	recs := readTopic(t, k.Brokers)
	checkExactlyOnce(t, pool, recs)
	if got, want := len(recs), len(orders)*len(lifecycle); got != want {
		t.Errorf("%d records, want %d", got, want)
	}
	waitFor(t, "the pending gauge at 0", func() bool { return gauge(t, r.m.pending) == 0 })
	if got, want := counter(t, r.m.published), float64(len(recs)); got != want {
		t.Errorf("published_total = %v, want %v", got, want)
	}
	if got := gauge(t, r.m.oldest); got != 0 {
		t.Errorf("oldest unpublished age = %v, want 0", got)
	}
	// The webhook's work list is untouched while a webhook may deliver.
	var undelivered int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM order_events WHERE webhook_done_at IS NULL`).Scan(&undelivered); err != nil {
		t.Fatal(err)
	}
	if undelivered != len(recs) {
		t.Errorf("%d events left for the webhook, want %d", undelivered, len(recs))
	}
	// More events later are relayed too.
	appendEvents(t, pool, 3)
	waitFor(t, "the later events published", func() bool { return unpublished(t, pool) == 0 })
	checkExactlyOnce(t, pool, readTopic(t, k.Brokers))
}

func TestRelayGaugesTheBacklog(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	k := testenv.NewKafka(t)
	appendEvents(t, pool, 5)
	clock := time.Now().Add(time.Hour)
	r := newTestRelay(t, pool, k, RelayConfig{Now: func() time.Time { return clock }})
	r.observe(context.Background())
	if got := gauge(t, r.m.pending); got != 10 {
		t.Errorf("pending = %v, want 10", got)
	}
	if got := gauge(t, r.m.oldest); got < 3500 {
		t.Errorf("oldest unpublished age = %v, want about an hour", got)
	}
}

var errCrash = errors.New("crash between the acknowledgement and the mark")

// A relay that stops after Kafka acknowledged and before it marked leaves
// records past the stored offsets; the next one marks them from Kafka and
// produces nothing twice.
func TestRelayRecoversAcknowledgedButUnmarked(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	k := testenv.NewKafka(t)
	appendEvents(t, pool, 20)
	crashes := 0
	var mu sync.Mutex
	r := newTestRelay(t, pool, k, RelayConfig{Batch: 5, WebhookOff: true, afterProduce: func() error {
		mu.Lock()
		defer mu.Unlock()
		crashes++
		if crashes%2 == 1 {
			return errCrash
		}
		return nil
	}})
	runRelay(t, r)
	waitFor(t, "every event published", func() bool { return unpublished(t, pool) == 0 })
	mu.Lock()
	n := crashes
	mu.Unlock()
	if n < 2 {
		t.Fatalf("%d produces, want several", n)
	}
	if got := counter(t, r.m.errors); got < 1 {
		t.Errorf("relay errors = %v, want at least 1", got)
	}
	checkExactlyOnce(t, pool, readTopic(t, k.Brokers))
	var undelivered int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM order_events WHERE webhook_done_at IS NULL`).Scan(&undelivered); err != nil {
		t.Fatal(err)
	}
	if undelivered != 0 {
		t.Errorf("%d events left for a webhook that is off, want 0", undelivered)
	}
}

// Several relays at once: one works, the others wait; when it stops,
// another takes over; nothing is published twice.
func TestRelaysTakeOverOneAtATime(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	k := testenv.NewKafka(t)
	appendEvents(t, pool, 10)
	relays := make([]*Relay, 3)
	stops := make([]func(), 3)
	for i := range relays {
		relays[i] = newTestRelay(t, pool, k, RelayConfig{Batch: 3})
		stops[i] = runRelay(t, relays[i])
	}
	waitFor(t, "the first events published", func() bool { return unpublished(t, pool) == 0 })
	leader := func() int {
		n, who := 0, -1
		for i, r := range relays {
			if gauge(t, r.m.leader) == 1 {
				n, who = n+1, i
			}
		}
		if n > 1 {
			t.Errorf("%d relays lead at once", n)
		}
		return who
	}
	var first int
	waitFor(t, "one leader", func() bool { first = leader(); return first >= 0 })
	stops[first]()
	appendEvents(t, pool, 10)
	waitFor(t, "the later events published by another relay", func() bool { return unpublished(t, pool) == 0 })
	if second := leader(); second == first {
		t.Errorf("relay %d still leads after it stopped", first)
	}
	checkExactlyOnce(t, pool, readTopic(t, k.Brokers))
}

func TestNewRelayRefusesBadKafkaSettings(t *testing.T) {
	if _, err := NewRelay(RelayConfig{}, nil, nil, nil); err == nil {
		t.Error("NewRelay without brokers: nil error")
	}
}

// The topic re-created empty (a broker's data lost) while the database
// keeps the relay's offsets: the offsets follow the topic down, so a crash
// after an acknowledgement still publishes nothing twice.
func TestRelayFollowsARecreatedTopic(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	old := testenv.NewKafka(t)
	appendEvents(t, pool, 20)
	stop := runRelay(t, newTestRelay(t, pool, old, RelayConfig{Batch: 50}))
	waitFor(t, "the first events published", func() bool { return unpublished(t, pool) == 0 })
	stop()

	fresh := testenv.NewKafka(t)
	appendEvents(t, pool, 3)
	crashed := false
	var mu sync.Mutex
	r := newTestRelay(t, pool, fresh, RelayConfig{Batch: 2, afterProduce: func() error {
		mu.Lock()
		defer mu.Unlock()
		if !crashed {
			crashed = true
			return errCrash
		}
		return nil
	}})
	runRelay(t, r)
	waitFor(t, "the later events published", func() bool { return unpublished(t, pool) == 0 })
	recs := readTopic(t, fresh.Brokers)
	seen := map[int64]int{}
	for _, rec := range recs {
		seen[rec.eventID]++
	}
	if len(seen) != 6 {
		t.Errorf("%d events on the new topic, want the 6 written after", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %d published %d times on the new topic, want 1", id, n)
		}
	}
}
