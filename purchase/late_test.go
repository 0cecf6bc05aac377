package purchase

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// heldBroker holds the broker's answer to every produce request while
// holding is set, then lets it through or, while refusing is set, answers
// it with a retriable error (after which franz-go fails the record, whose
// own context ended long ago, for sure).
type heldBroker struct {
	k                  *testenv.Kafka
	holding, refusing  atomic.Bool
	answer             atomic.Pointer[chan struct{}] // closed: the held answers go out
	answered, produced atomic.Int64
}

func newHeldBroker(t *testing.T) *heldBroker {
	h := &heldBroker{k: testenv.NewKafka(t)}
	h.hold()
	h.k.Cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		h.k.Cluster.KeepControl()
		h.produced.Add(1)
		if h.holding.Load() {
			ch := *h.answer.Load()
			h.k.Cluster.SleepControl(func() { <-ch })
		}
		if !h.refusing.Load() {
			return nil, nil, false
		}
		h.answered.Add(1)
		return testenv.RefuseProduce(req), nil, true
	})
	return h
}

// hold holds the next produce requests' answers until release.
func (h *heldBroker) hold() {
	ch := make(chan struct{})
	h.answer.Store(&ch)
	h.holding.Store(true)
}

func (h *heldBroker) release() {
	h.holding.Store(false)
	close(*h.answer.Load())
}

// A claim whose publish outlives its bound is answered 503 with its id, and
// so is a retry while nobody knows its fate (never ALREADY_PURCHASED).
// Once the broker refuses it, the unit is held for the holder again at
// once (not after the Reconciler's bound): by the settle loop, or by the
// holder's retry, which then buys it. Once the broker writes it, a retry
// is answered 202 with it.
func TestLatePublishSettles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	h := newHeldBroker(t)
	const bound = 500 * time.Millisecond
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: h.k.Brokers, PublishTimeout: bound, CloseTimeout: time.Second, Producers: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx := context.Background()
	if err := p.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	clk := newClock(t0)
	s := New(Config{Now: clk.now, PublishTimeout: bound}, e.st, p, nil, nil)
	item := e.item(0)
	until := t0.Add(2 * time.Minute)
	orders := map[int64]string{}
	for _, u := range []int64{1, 2, 3} {
		orders[u] = uuid.NewString()
		if err := e.st.Hold(ctx, e.sale.ID, item.ID, u, orders[u], until); err != nil {
			t.Fatal(err)
		}
	}
	uncertainClaim := func(u int64) {
		t.Helper()
		_, err := s.Claim(ctx, e.sale, item, u)
		var fe *flashsale.Error
		if codeOf(err) != flashsale.CodeUnavailable || !kafka.IsUncertain(err) || !errors.As(err, &fe) || fe.OrderID != orders[u] {
			t.Fatalf("claim of user %d with the broker's answer held: %v, want an uncertain UNAVAILABLE naming %s", u, err, orders[u])
		}
	}

	// Refused: users 1 and 2.
	h.refusing.Store(true)
	uncertainClaim(1)
	uncertainClaim(2)
	if s.Unsettled() != 2 {
		t.Fatalf("unsettled %d, want the 2 late publishes", s.Unsettled())
	}
	// A retry while the outcome is unknown: 503 with the id again.
	_, err = s.Claim(ctx, e.sale, item, 1)
	var fe *flashsale.Error
	if codeOf(err) != flashsale.CodeUnavailable || !errors.As(err, &fe) || fe.OrderID != orders[1] {
		t.Fatalf("retry with the outcome unknown: %v, want UNAVAILABLE naming %s", err, orders[1])
	}
	h.release()
	testenv.Eventually(t, "the broker's refusal", 10*time.Second, func() bool { return h.answered.Load() > 0 })
	// User 2's by the settle loop: held again, not pending.
	testenv.Eventually(t, "user 2's unit held again", 10*time.Second, func() bool {
		s.settleAll(ctx)
		_, _, held, err := e.st.Held(ctx, e.sale.ID, 2)
		return err == nil && held
	})
	h.refusing.Store(false)
	// User 1's by the retry, which buys it.
	testenv.Eventually(t, "user 1's retry buys", 10*time.Second, func() bool {
		got, err := s.Claim(ctx, e.sale, item, 1)
		if err != nil && codeOf(err) != flashsale.CodeUnavailable {
			t.Fatalf("retry after the refusal: %v, want 202 (or 503 until franz-go fails the record)", err)
		}
		return err == nil && got == orders[1]
	})
	if got, err := s.Claim(ctx, e.sale, item, 2); err != nil || got != orders[2] {
		t.Fatalf("user 2's claim of the unit held again: %q, %v; want %s", got, err, orders[2])
	}

	// Written late: user 3.
	h.hold()
	uncertainClaim(3)
	h.release()
	testenv.Eventually(t, "user 3's retry answered 202", 10*time.Second, func() bool {
		got, err := s.Claim(ctx, e.sale, item, 3)
		if err != nil && codeOf(err) != flashsale.CodeUnavailable {
			t.Fatalf("retry after the late write: %v, want 202 (or 503 until the outcome is known)", err)
		}
		return err == nil && got == orders[3]
	})
	if n := s.Unsettled(); n != 0 {
		t.Errorf("unsettled %d at the end, want 0", n)
	}
	if got := topicRecords(t, h.k, flashsale.TopicOrders); got != 3 {
		t.Errorf("%d records in the orders topic, want 3 (each order once)", got)
	}
	if v := counterValue(t, s.outcomes[OutcomeLateFailed]); v != 2 {
		t.Errorf("late_failed %v, want 2", v)
	}
	if v := counterValue(t, s.outcomes[OutcomeLateWritten]); v != 1 {
		t.Errorf("late_written %v, want 1", v)
	}
}
