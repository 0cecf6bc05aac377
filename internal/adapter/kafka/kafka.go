// Package kafka is the Kafka adapter of the purchase path: a bounded,
// idempotent, acks=all producer of flashsale.OrderPlaced messages and the
// topic set-up for a real cluster, and the order log the reconciler reads.
// Its API carries no franz-go type except the client options ClientOpts
// gives the writer and the wiring, the other franz-go users (TestAPI keeps
// this true): the writer consumes with a client of its own and
// internal/wiring checks the brokers and runs the embedded broker, and
// every client gets its brokers, TLS, SASL and logger from ClientOpts;
// TestLayout (layout_test.go) lists every package allowed to import
// franz-go.
//
// # Blocking rules
//
// Publish never waits longer than ProducerConfig.PublishTimeout, even when
// every broker is gone (franz-go's idempotent producer would otherwise keep a
// record, and its caller, waiting for as long as the broker is away).
//
// # Definite and uncertain failures
//
// An idempotent producer fails a record only when it knows the record was
// not written: the record was never sent, or the broker answered. Such a
// failure is definite: the caller may give the reservation back at once.
//
// When the bound passes while a request is in flight (or the client is
// closed under it), nobody knows whether the broker wrote the record: it may
// still be produced and acknowledged later. Publish then returns an error
// whose Uncertain method reports true (see IsUncertain). The caller must keep
// the reservation as it is: if the record lands, the writer stores the order
// and confirms the reservation; if it never lands, the reconciler finds the
// reservation still pending after its bound and, once OrderLog shows the
// writer group has consumed everything the broker held past the publish
// bound, writes a REJECTED tombstone row with the order id and gives the
// unit back; a record arriving after that hits the tombstone (ON CONFLICT
// (id) DO NOTHING in the writer) and is not counted. Releasing an uncertain
// reservation at once instead would let a late record create an order whose
// unit Redis has already given away. The error's Outcome reports the
// record's fate once franz-go decides it (the broker answered, or came back
// and the record failed unsent), so the caller may settle it then, long
// before the reconciler's bound.
//
// # Broker restarts
//
// The clients reconnect by themselves. A broker re-created empty on the same
// address gives its topics new IDs, which franz-go refuses to adopt: records
// fail with UNKNOWN_TOPIC_ID (a definite failure) and the producer then
// purges the topic from its clients, which find it again at the next
// produce. A record failed while a purge runs may have been on the wire: it
// is reported uncertain.
package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
)

// Defaults of ProducerConfig.
const (
	// DefaultPublishTimeout leaves a record unsent for up to 2.5 s before
	// it is failed (half the bound). The bound is generous because on a
	// gateway whose CPU is shared with a crowd, each of the producer's
	// goroutine hops (the drain, the request writer, the response reader,
	// the promise) waits its turn behind the gateway's other goroutines
	// (HTTP requests, room connections), and a tighter bound fails
	// purchases that would have gone through (figures in
	// docs/benchmarks/load.md).
	DefaultPublishTimeout = 5 * time.Second
	DefaultCloseTimeout   = 5 * time.Second
)

// ProducerConfig configures a Producer. Zero fields take the defaults.
type ProducerConfig struct {
	Brokers  []string
	Security Security // TLS and SASL to the brokers
	// Topic receives OrderPlaced messages (default flashsale.TopicOrders);
	// DeadLetterTopic receives refused ones (default
	// flashsale.TopicDeadLetter).
	Topic           string
	DeadLetterTopic string
	// PublishTimeout bounds one Publish, broker or no broker (default 5s).
	PublishTimeout time.Duration
	// Linger is how long a batch waits for more records. Default 0, not
	// franz-go's 10ms: every Publish waits for its acknowledgement, and
	// while one request is in flight the next batch fills by itself, so a
	// linger only delays every acknowledgement (BenchmarkPublish compares
	// lingers).
	Linger time.Duration
	// CloseTimeout bounds the flush in Close (default 5s).
	CloseTimeout time.Duration
	// MaxBufferedRecords caps the records waiting for the brokers, per
	// producer; a Publish beyond it fails at once (default 50,000).
	MaxBufferedRecords int
	// Producers is how many independent idempotent producers (each its own
	// connection and producer ID) Publish spreads records over, round
	// robin (default 4). An idempotent producer keeps one produce request
	// in flight per broker, so under a crowd each record also waits for
	// the answer to the request before its own, and on a gateway starved
	// of CPU that wait can outlast half the publish bound (the purchase is
	// then answered 503). N producers keep N requests in flight; each
	// stays idempotent.
	Producers int
}

// DefaultProducers is ProducerConfig.Producers' default.
const DefaultProducers = 4

// Producer publishes orders to Kafka. It is safe for concurrent use.
type Producer struct {
	cls  []*kgo.Client // ProducerConfig.Producers; Publish takes them in turn
	next atomic.Uint64
	// purges counts topic purges (recreated topics, see purge): it goes up
	// before and after each, so a record failed across a purge sees it
	// change. purging is set while one runs; lastPurge (Unix ns) spaces
	// them.
	purges    atomic.Uint64
	purging   atomic.Bool
	lastPurge atomic.Int64
	topic     string
	dlq       string
	timeout   time.Duration
	closeTO   time.Duration
	log       *slog.Logger
}

// NewProducer returns a producer with acks=all and idempotence, keyed by
// item (one item's orders go to one partition; records of the several
// producers interleave there, which no reader depends on). It does not
// wait for a broker; use Ping for that.
func NewProducer(cfg ProducerConfig, logger *slog.Logger) (*Producer, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafka.NewProducer: no brokers")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "kafka-producer")
	if cfg.Topic == "" {
		cfg.Topic = flashsale.TopicOrders
	}
	if cfg.DeadLetterTopic == "" {
		cfg.DeadLetterTopic = flashsale.TopicDeadLetter
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = DefaultPublishTimeout
	}
	cfg.Linger = max(cfg.Linger, 0)
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = DefaultCloseTimeout
	}
	opts, err := ClientOpts(cfg.Brokers, cfg.Security, logger)
	if err != nil {
		return nil, fmt.Errorf("kafka.NewProducer: %w", err)
	}
	opts = append(opts,
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence stays on (the default)
		kgo.ProducerLinger(cfg.Linger),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // murmur2 of the key, as Kafka's Java client
	)
	if cfg.MaxBufferedRecords > 0 {
		opts = append(opts, kgo.MaxBufferedRecords(cfg.MaxBufferedRecords))
	}
	if cfg.Producers <= 0 {
		cfg.Producers = DefaultProducers
	}
	p := &Producer{topic: cfg.Topic, dlq: cfg.DeadLetterTopic, timeout: cfg.PublishTimeout, closeTO: cfg.CloseTimeout, log: logger}
	for range cfg.Producers {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			for _, c := range p.cls {
				c.Close()
			}
			return nil, fmt.Errorf("kafka.NewProducer: %w", err)
		}
		p.cls = append(p.cls, cl)
	}
	return p, nil
}

// PublishError is a failed Publish. Uncertain reports whether the record may
// still be written later (see the package documentation).
type PublishError struct {
	uncertain bool
	err       error
	// outcome, on an error returned because the bound passed, reports
	// the record's fate once franz-go decides it (see Outcome).
	outcome func() (bool, error)
}

// Outcome reports, for an uncertain error returned because the bound
// passed while franz-go still held the record, whether its fate is known
// now and what it is: nil when the record was written after all, a
// definite *PublishError when it never will be (its reservation may be
// given back at once), an uncertain one when nobody can tell. A broker that
// comes back decides every record it held within moments, long before the
// Reconciler's bound. known is false for other errors, and until then; it
// never blocks.
func (e *PublishError) Outcome() (known bool, err error) {
	if e.outcome == nil {
		return false, nil
	}
	return e.outcome()
}

func (e *PublishError) Error() string {
	if e.uncertain {
		return "kafka.Publish: outcome unknown: " + e.err.Error()
	}
	return "kafka.Publish: " + e.err.Error()
}

func (e *PublishError) Unwrap() error { return e.err }

// Uncertain reports whether the record may still be produced after the
// error was returned.
func (e *PublishError) Uncertain() bool { return e.uncertain }

// ErrTimeout is wrapped by an uncertain PublishError returned because the
// bound passed before the broker answered.
var ErrTimeout = errors.New("no acknowledgement within the publish bound")

// IsUncertain reports whether err says that a record may still be produced
// later (any error in the chain with an Uncertain() bool method that reports
// true).
func IsUncertain(err error) bool {
	var u interface{ Uncertain() bool }
	return errors.As(err, &u) && u.Uncertain()
}

// Bound is how long a Publish waits at most (ProducerConfig.PublishTimeout):
// a caller need not bound it with a deadline of its own.
func (p *Producer) Bound() time.Duration { return p.timeout }

// Publish sends o to the orders topic and waits for the acknowledgement of
// every in-sync replica, at most PublishTimeout (and not past ctx). A nil
// error means the order is durably in Kafka. An error is a *PublishError;
// when it is uncertain, the record may still land (see the package
// documentation).
func (p *Producer) Publish(ctx context.Context, o flashsale.OrderPlaced) error {
	_, _, err := p.PublishAt(ctx, o)
	return err
}

// PublishAt is Publish that also reports where the record landed: its
// partition and offset in the orders topic (valid when err is nil).
func (p *Producer) PublishAt(ctx context.Context, o flashsale.OrderPlaced) (partition int32, offset int64, err error) {
	v, err := json.Marshal(o)
	if err != nil {
		return 0, 0, &PublishError{err: err}
	}
	rec, err := p.produce(ctx, p.topic, o.ItemID, v)
	if err != nil {
		return 0, 0, err
	}
	return rec.Partition, rec.Offset, nil
}

// deadLetter is the value on the dead-letter topic: the order plus why it
// was refused.
type deadLetter struct {
	flashsale.OrderPlaced
	Reason string `json:"reason"`
}

// PublishDeadLetter sends o with reason to the dead-letter topic, with the
// same bound and acknowledgement rules as Publish.
func (p *Producer) PublishDeadLetter(ctx context.Context, o flashsale.OrderPlaced, reason string) error {
	v, err := json.Marshal(deadLetter{OrderPlaced: o, Reason: reason})
	if err != nil {
		return &PublishError{err: err}
	}
	_, err = p.produce(ctx, p.dlq, o.ItemID, v)
	return err
}

// produce sends one record and returns it as acknowledged (partition and
// offset set) or a *PublishError.
func (p *Producer) produce(ctx context.Context, topic string, itemID int64, value []byte) (*kgo.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, &PublishError{err: err} // never handed to the client
	}
	// The record's own context is not the caller's: a caller giving up
	// must not cancel a record that may already be on the wire. franz-go
	// fails the record when this context ends, but only if it is safe
	// (never sent, or answered). A record still unsent at half the bound
	// is failed then, which leaves the other half for franz-go to say so
	// (usually within a millisecond; a retry backoff can delay it). A
	// record on the wire keeps waiting for its answer up to the bound.
	bound := p.timeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < bound {
		bound = time.Until(dl)
	}
	//
	// One timer serves both halves (a purchase publishes under a crowd,
	// where every timer counts): it cuts the record's context at half the
	// bound, then is set again for the other half.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	rec := &kgo.Record{Topic: topic, Key: strconv.AppendInt(nil, itemID, 10), Value: value}
	// TryProduce never blocks: with the buffer full it fails at once.
	cl := p.cls[p.next.Add(1)%uint64(len(p.cls))]
	gen := p.purges.Load()
	cl.TryProduce(rctx, rec, func(_ *kgo.Record, err error) {
		cancel()
		done <- err
	})
	half := bound / 2
	t := time.NewTimer(half)
	defer t.Stop()
	select {
	case err := <-done:
		return p.result(rec, gen, err)
	case <-t.C:
		// Half the bound: an unsent record fails now; a sent one waits
		// for its answer.
		cancel()
		t.Reset(bound - half)
		select {
		case err := <-done:
			return p.result(rec, gen, err)
		case <-t.C:
		case <-ctx.Done():
		}
	case <-ctx.Done():
	}
	// The promise may have just arrived.
	select {
	case err := <-done:
		return p.result(rec, gen, err)
	default:
	}
	// The promise arrives later (franz-go calls it exactly once): done
	// keeps it for Outcome, read once.
	var (
		mu    sync.Mutex
		known bool
		final error
	)
	outcome := func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if !known {
			select {
			case err := <-done:
				known = true
				if _, rerr := p.result(rec, gen, err); rerr != nil {
					final = rerr
				}
			default:
			}
		}
		return known, final
	}
	return nil, &PublishError{uncertain: true, err: ErrTimeout, outcome: outcome}
}

// result turns a record's outcome into produce's answer. A closing client
// fails records whose request may have been written, and so does a purge;
// everything else franz-go fails only when it is safe.
func (p *Producer) result(rec *kgo.Record, gen uint64, err error) (*kgo.Record, error) {
	if err == nil {
		return rec, nil
	}
	uncertain := errors.Is(err, kgo.ErrClientClosed) || p.purges.Load() != gen || p.purging.Load()
	if errors.Is(err, kerr.UnknownTopicID) {
		p.purge(rec.Topic)
	}
	return nil, &PublishError{uncertain: uncertain, err: err}
}

// purgeEvery spaces the purges of a recreated topic.
const purgeEvery = time.Second

// purge makes every producer forget topic, so that it adopts the topic's new ID. A
// broker re-created empty on the same address (the embedded broker without
// its data directory) gives its topics new IDs; franz-go keeps the first ID
// it saw and fails every record with UNKNOWN_TOPIC_ID until the topic is
// purged, and then finds the topic again at the next produce.
func (p *Producer) purge(topic string) {
	now := time.Now().UnixNano()
	if last := p.lastPurge.Load(); now-last < int64(purgeEvery) || !p.lastPurge.CompareAndSwap(last, now) {
		return
	}
	if !p.purging.CompareAndSwap(false, true) {
		return
	}
	p.purges.Add(1)
	p.log.Warn("the topic was re-created (new topic ID); purging it from the producer", "topic", topic)
	for _, c := range p.cls {
		c.PurgeTopicsFromClient(topic)
	}
	p.purges.Add(1)
	p.purging.Store(false)
}

// Ping checks that a broker answers (for /readyz).
func (p *Producer) Ping(ctx context.Context) error {
	if err := p.cls[0].Ping(ctx); err != nil {
		return fmt.Errorf("kafka.Ping: %w", err)
	}
	return nil
}

// Prepare connects every producer to the brokers and loads its idempotent
// producer ID, so that the first Publish under a crowd needs neither a dial
// nor an extra round trip (an InitProducerID that times out fails every
// record buffered behind it).
func (p *Producer) Prepare(ctx context.Context) error {
	for _, cl := range p.cls {
		if err := cl.Ping(ctx); err != nil {
			return fmt.Errorf("kafka.Prepare: %w", err)
		}
		if _, _, err := cl.ProducerID(ctx); err != nil {
			return fmt.Errorf("kafka.Prepare: producer ID: %w", err)
		}
	}
	return nil
}

// Close flushes buffered records for at most CloseTimeout, then closes the
// client. Records still unacknowledged then are failed (their Publish calls
// have long returned: they are the reconciler's).
func (p *Producer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), p.closeTO)
	defer cancel()
	for _, cl := range p.cls {
		if err := cl.Flush(ctx); err != nil {
			p.log.Warn("flush before close did not finish", "err", err)
		}
	}
	for _, cl := range p.cls {
		cl.Close()
	}
}

// TopicSettings are the partitions and replication factor of the topics
// EnsureTopics creates.
type TopicSettings struct {
	// Partitions bounds how many writers share the work (one partition
	// goes to one writer of the group); 0: DefaultPartitions.
	Partitions int32
	// ReplicationFactor is each partition's copies; 0: the broker's
	// default (default.replication.factor).
	ReplicationFactor int16
}

// DefaultPartitions is TopicSettings.Partitions' default.
const DefaultPartitions = 8

// EnsureTopics creates the topics that do not exist yet with ts (for a
// real cluster; the embedded broker creates its topics itself). A topic
// that exists is left as it is.
func EnsureTopics(ctx context.Context, brokers []string, sec Security, ts TopicSettings, logger *slog.Logger, topics ...string) error {
	opts, err := ClientOpts(brokers, sec, logger)
	if err != nil {
		return fmt.Errorf("kafka.EnsureTopics: %w", err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka.EnsureTopics: %w", err)
	}
	defer cl.Close()
	if ts.Partitions <= 0 {
		ts.Partitions = DefaultPartitions
	}
	rf := ts.ReplicationFactor
	if rf <= 0 {
		rf = -1 // the broker's default
	}
	adm := kadm.NewClient(cl)
	res, err := adm.CreateTopics(ctx, ts.Partitions, rf, nil, topics...)
	if err != nil {
		return fmt.Errorf("kafka.EnsureTopics: %w", err)
	}
	for _, t := range topics {
		r, ok := res[t]
		if !ok {
			return fmt.Errorf("kafka.EnsureTopics: %s: missing from the response", t)
		}
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kafka.EnsureTopics: %s: %w", t, r.Err)
		}
	}
	return nil
}
