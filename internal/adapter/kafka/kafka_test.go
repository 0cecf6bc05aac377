package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// hangBound is the publish bound of the tests not about the bound: it
// only guards against a hang (a first publish on a machine under load
// waits for metadata and a producer ID well past a few seconds).
const hangBound = 30 * time.Second

func newProducer(t testing.TB, brokers []string, timeout time.Duration) *Producer {
	t.Helper()
	p, err := NewProducer(ProducerConfig{Brokers: brokers, PublishTimeout: timeout, CloseTimeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// consume reads n records of topic from the start.
func consume(t *testing.T, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hangBound)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d records of %s, want %d", len(out), topic, n)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

func TestPublishKeyedByItem(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	p := newProducer(t, k.Brokers, hangBound)
	ctx := context.Background()
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	orders := []flashsale.OrderPlaced{
		{OrderID: "a", SaleID: 7, ItemID: 1001, UserID: 1, PriceCents: 1999, CreatedAtMs: 1},
		{OrderID: "b", SaleID: 7, ItemID: 1002, UserID: 2, PriceCents: 2999, CreatedAtMs: 2},
		{OrderID: "c", SaleID: 7, ItemID: 1001, UserID: 3, PriceCents: 1999, CreatedAtMs: 3},
	}
	for _, o := range orders {
		if err := p.Publish(ctx, o); err != nil {
			t.Fatalf("Publish(%s): %v", o.OrderID, err)
		}
	}
	got := consume(t, k.Brokers, flashsale.TopicOrders, len(orders))
	byID := map[string]*kgo.Record{}
	for _, r := range got {
		var o flashsale.OrderPlaced
		if err := json.Unmarshal(r.Value, &o); err != nil {
			t.Fatalf("value %q: %v", r.Value, err)
		}
		byID[o.OrderID] = r
	}
	for _, o := range orders {
		r := byID[o.OrderID]
		if r == nil {
			t.Fatalf("order %s not consumed", o.OrderID)
		}
		var back flashsale.OrderPlaced
		_ = json.Unmarshal(r.Value, &back)
		if back != o {
			t.Errorf("consumed %+v, want %+v", back, o)
		}
		if want := map[int64]string{1001: "1001", 1002: "1002"}[o.ItemID]; string(r.Key) != want {
			t.Errorf("key of %s = %q, want %q", o.OrderID, r.Key, want)
		}
	}
	if byID["a"].Partition != byID["c"].Partition {
		t.Errorf("orders of one item on partitions %d and %d, want one", byID["a"].Partition, byID["c"].Partition)
	}
}

// TestPublishSpreadOverProducers: concurrent publishes go out through
// every producer (each with its own producer ID) and each record lands
// once.
func TestPublishSpreadOverProducers(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	p, err := NewProducer(ProducerConfig{Brokers: k.Brokers, Producers: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	const n = 300
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			errs <- p.Publish(context.Background(), flashsale.OrderPlaced{OrderID: strconv.Itoa(i), SaleID: 1, ItemID: int64(1001 + i%2)})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	got := consume(t, k.Brokers, flashsale.TopicOrders, n)
	seen, producers := map[string]int{}, map[int64]int{}
	for _, r := range got {
		var o flashsale.OrderPlaced
		if err := json.Unmarshal(r.Value, &o); err != nil {
			t.Fatal(err)
		}
		seen[o.OrderID]++
		producers[r.ProducerID]++
	}
	if len(seen) != n || len(got) != n {
		t.Errorf("%d records, %d distinct orders; want %d of each", len(got), len(seen), n)
	}
	if len(producers) != 3 {
		t.Errorf("records from producer IDs %v, want 3 producers", producers)
	}
}

func TestPublishDeadLetterCarriesReason(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	p := newProducer(t, k.Brokers, hangBound)
	o := flashsale.OrderPlaced{OrderID: "x", SaleID: 1, ItemID: 5, UserID: 9}
	if err := p.PublishDeadLetter(context.Background(), o, "oversold"); err != nil {
		t.Fatal(err)
	}
	r := consume(t, k.Brokers, flashsale.TopicDeadLetter, 1)[0]
	var got struct {
		flashsale.OrderPlaced
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(r.Value, &got); err != nil {
		t.Fatal(err)
	}
	if got.OrderPlaced != o || got.Reason != "oversold" {
		t.Errorf("dead letter = %+v, want %+v with reason oversold", got, o)
	}
}

// publishBounded runs Publish and fails the test if it has not returned well
// after the bound (a hang, not a speed check).
func publishBounded(t *testing.T, p *Producer, ctx context.Context, o flashsale.OrderPlaced) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Publish(ctx, o) }()
	select {
	case err := <-done:
		return err
	case <-time.After(p.timeout + 10*time.Second):
		t.Errorf("Publish still blocked long after its bound %v", p.timeout)
		return errors.New("hung")
	}
}

func TestPublishBoundedWhenBrokerGone(t *testing.T) {
	t.Parallel()
	for _, warm := range []bool{false, true} {
		name := map[bool]string{false: "cold", true: "warm"}[warm]
		t.Run(name, func(t *testing.T) {
			k := testenv.NewKafka(t)
			p := newProducer(t, k.Brokers, time.Second)
			ctx := context.Background()
			if warm {
				if err := p.Publish(ctx, flashsale.OrderPlaced{OrderID: "w", ItemID: 1}); err != nil {
					t.Fatal(err)
				}
			}
			k.Cluster.Close()
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = publishBounded(t, p, ctx, flashsale.OrderPlaced{OrderID: "z", ItemID: int64(i)})
				}()
			}
			wg.Wait()
			for i, err := range errs {
				var pe *PublishError
				if !errors.As(err, &pe) {
					t.Fatalf("publish %d with the broker gone: err = %v, want a *PublishError", i, err)
				}
				// Without a connection nothing was ever sent: franz-go
				// fails the record for sure. With one, the request may
				// have been written into the dying connection, and
				// nobody can tell whether the broker took it.
				if !warm && IsUncertain(err) {
					t.Errorf("publish %d before any connection: %v, want a definite failure", i, err)
				}
				t.Logf("publish %d: %v (uncertain %v)", i, err, IsUncertain(err))
			}
			if err := p.Ping(ctx); err == nil {
				t.Error("Ping with the broker gone: nil error")
			}
		})
	}
}

func TestPublishCallerGivesUp(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	p := newProducer(t, k.Brokers, hangBound)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := p.Publish(ctx, flashsale.OrderPlaced{OrderID: "c", ItemID: 1})
	if err == nil || IsUncertain(err) {
		t.Fatalf("Publish with a cancelled context: err = %v, want a definite failure", err)
	}
}

func TestIsUncertain(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errors.New("x"), false},
		{"definite", &PublishError{err: errors.New("x")}, false},
		{"uncertain", &PublishError{uncertain: true, err: ErrTimeout}, true},
		{"wrapped uncertain", errors.Join(errors.New("ctx"), &PublishError{uncertain: true, err: ErrTimeout}), true},
	}
	for _, tc := range tests {
		if got := IsUncertain(tc.err); got != tc.want {
			t.Errorf("%s: IsUncertain = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestEnsureTopics(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// One topic exists already, one is new: both end up there, no error.
	if err := EnsureTopics(ctx, k.Brokers, Security{}, TopicSettings{Partitions: 3}, nil, flashsale.TopicOrders, "flash-sale-extra"); err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	if err := EnsureTopics(ctx, k.Brokers, Security{}, TopicSettings{Partitions: 3}, nil, "flash-sale-extra"); err != nil {
		t.Fatalf("EnsureTopics again: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx, "flash-sale-extra")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(td["flash-sale-extra"].Partitions); got != 3 {
		t.Errorf("flash-sale-extra has %d partitions, want 3", got)
	}
	// The replication factor is the setting's, and the partitions default.
	if err := EnsureTopics(ctx, k.Brokers, Security{}, TopicSettings{ReplicationFactor: 1}, nil, "flash-sale-rf"); err != nil {
		t.Fatalf("EnsureTopics with a replication factor: %v", err)
	}
	td, err = kadm.NewClient(cl).ListTopics(ctx, "flash-sale-rf")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(td["flash-sale-rf"].Partitions); got != DefaultPartitions {
		t.Errorf("flash-sale-rf has %d partitions, want %d", got, DefaultPartitions)
	}
	for _, p := range td["flash-sale-rf"].Partitions {
		if got := len(p.Replicas); got != 1 {
			t.Errorf("flash-sale-rf partition %d has %d replicas, want 1", p.Partition, got)
		}
	}
}

// BenchmarkPublish is concurrent acknowledged publishes (64 goroutines, as
// many shoppers at once) for a few lingers.
func BenchmarkPublish(b *testing.B) {
	for _, linger := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond} {
		b.Run("linger="+linger.String(), func(b *testing.B) {
			k := testenv.NewKafka(b)
			p, err := NewProducer(ProducerConfig{Brokers: k.Brokers, Linger: linger}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := p.Publish(ctx, flashsale.OrderPlaced{OrderID: "o", ItemID: 1001, SaleID: 1}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// TestPrepare: Prepare loads the producer ID against a live broker and
// fails, bounded by its context, when there is none.
func TestPrepare(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	p := newProducer(t, k.Brokers, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Prepare(ctx); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	ids := map[int64]bool{}
	for _, cl := range p.cls {
		id, _, err := cl.ProducerID(ctx)
		if err != nil || id < 0 {
			t.Errorf("producer ID after Prepare = %d, %v", id, err)
		}
		ids[id] = true
	}
	if len(p.cls) != DefaultProducers || len(ids) != DefaultProducers {
		t.Errorf("%d producers with %d producer IDs, want %d of each", len(p.cls), len(ids), DefaultProducers)
	}
	if err := p.Publish(ctx, flashsale.OrderPlaced{OrderID: "after-prepare", ItemID: 1}); err != nil {
		t.Errorf("Publish after Prepare: %v", err)
	}
	k.Cluster.Close()
	gone := newProducer(t, k.Brokers, time.Second)
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	// Prepare answers (a refused dial, or its context's end) instead of
	// retrying for as long as franz-go would.
	if err := gone.Prepare(short); err == nil {
		t.Error("Prepare with the broker gone: nil error")
	}
}

// TestPublishOutcomeAfterTheBound holds the broker's answer to a produce
// past the publish bound: Publish returns an uncertain error, and its
// Outcome reports the record's fate once the broker answers, written or
// refused, without waiting for anything.
func TestPublishOutcomeAfterTheBound(t *testing.T) {
	t.Parallel()
	for _, refuse := range []bool{false, true} {
		name := map[bool]string{false: "written", true: "refused"}[refuse]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k := testenv.NewKafka(t)
			p := newProducer(t, k.Brokers, 500*time.Millisecond)
			ctx := context.Background()
			if err := p.Prepare(ctx); err != nil {
				t.Fatal(err)
			}
			answer := make(chan struct{})
			var held sync.Once
			k.Cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				first := false
				held.Do(func() { first = true })
				if !first {
					return nil, nil, false
				}
				k.Cluster.SleepControl(func() { <-answer })
				if !refuse {
					return nil, nil, false // written as usual
				}
				// Answered with a retriable error: the record, whose own
				// context ended long ago, is then failed for sure.
				return testenv.RefuseProduce(req), nil, true
			})
			err := p.Publish(ctx, flashsale.OrderPlaced{OrderID: "late-" + name, ItemID: 1})
			var pe *PublishError
			if !errors.As(err, &pe) || !pe.Uncertain() {
				close(answer)
				t.Fatalf("Publish with the answer held past the bound: %v, want an uncertain *PublishError", err)
			}
			if known, _ := pe.Outcome(); known {
				t.Error("Outcome known before the broker answered")
			}
			close(answer)
			var oerr error
			testenv.Eventually(t, "the record's outcome", 10*time.Second, func() bool {
				var known bool
				known, oerr = pe.Outcome()
				return known
			})
			switch {
			case !refuse && oerr != nil:
				t.Fatalf("outcome of a record the broker wrote: %v, want nil", oerr)
			case refuse && (oerr == nil || IsUncertain(oerr)):
				t.Fatalf("outcome of a record the broker refused: %v, want a definite failure", oerr)
			}
			if known, again := pe.Outcome(); !known || again != oerr {
				t.Errorf("Outcome read twice: %v %v, want %v again", known, again, oerr)
			}
			if !refuse {
				recs := consume(t, k.Brokers, flashsale.TopicOrders, 1)
				var o flashsale.OrderPlaced
				if err := json.Unmarshal(recs[0].Value, &o); err != nil || o.OrderID != "late-written" {
					t.Fatalf("record in the topic: %s (%v), want late-written", recs[0].Value, err)
				}
			}
		})
	}
}
