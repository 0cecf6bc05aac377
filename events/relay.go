package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/prom"
)

// Record headers of a published event, beside its key (the order id) and
// its value (the event's JSON).
const (
	HeaderEventID   = "eventId"
	HeaderEventType = "eventType"
)

// relayLockKey is the PostgreSQL advisory lock the working relay holds
// (postgres.Migrate holds 726172).
const relayLockKey = 726173

// RelayConfig configures a Relay.
type RelayConfig struct {
	Brokers  []string
	Security kafka.Security
	// Topic is where the events go. "": flashsale.TopicOrderEvents.
	Topic string
	// Batch is how many events one produce carries at most. 0: 500.
	Batch int
	// Interval is the wait between looks for new events when none are
	// waiting, and between tries of a relay waiting for the lock. 0: 500ms.
	Interval time.Duration
	// OpTimeout bounds each step: a produce, a mark, a recovery. 0: 30s.
	OpTimeout time.Duration
	// WebhookOff marks events delivered to the webhook as they are
	// published, when no webhook is configured, so the webhook's work list
	// stays empty; a webhook configured later starts from the events
	// written after.
	WebhookOff bool
	// Now is the clock of published_at and of the oldest-age gauge. nil:
	// time.Now.
	Now func() time.Time

	// afterProduce, in tests, runs once a produce is acknowledged and
	// before its events are marked; an error stops the relay there, as a
	// crash would.
	afterProduce func() error
}

// Relay publishes the outbox to Kafka, exactly once and in order per order.
//
// Only one relay works at a time: it holds a PostgreSQL advisory lock on a
// connection of its own and does all its database work on that connection,
// so a relay whose session ended (and whose lock another took) cannot mark
// anything. Others wait and take over when it stops.
//
// It reads unpublished events in id order and produces them keyed by order
// id (one order's events in one partition, in the order of their ids; the
// producer is idempotent, so its own retries keep that order), then marks
// them published together with, per partition, the offset after the last
// record it marked. A relay that crashed after Kafka acknowledged a produce
// and before the mark left records past that offset: every relay, when it
// takes the lock and after any error, first reads each partition from its
// offset to its end and marks the events found there, so an acknowledged
// event is never produced twice.
type Relay struct {
	cfg  RelayConfig
	pool *pgxpool.Pool
	opts []kgo.Opt
	log  *slog.Logger
	m    relayMetrics
}

type relayMetrics struct {
	pending, oldest, leader prometheus.Gauge
	published, errors       prometheus.Counter
}

var errNotLeader = errors.New("another relay holds the lock")

// NewRelay returns a Relay; the Kafka settings are checked here, so bad
// ones fail at start.
func NewRelay(cfg RelayConfig, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	if cfg.Topic == "" {
		cfg.Topic = flashsale.TopicOrderEvents
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "events-relay")
	opts, err := kafka.ClientOpts(cfg.Brokers, cfg.Security, logger)
	if err != nil {
		return nil, fmt.Errorf("events.NewRelay: %w", err)
	}
	r := &Relay{cfg: cfg, pool: pool, opts: opts, log: logger}
	var errs [5]error
	r.m.pending, errs[0] = prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flashsale_events_pending",
		Help: "Order events written and not yet published to Kafka.",
	}))
	r.m.oldest, errs[1] = prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flashsale_events_oldest_unpublished_age_seconds",
		Help: "Age of the oldest order event not yet published to Kafka (0: none).",
	}))
	r.m.leader, errs[2] = prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flashsale_events_relay_leader",
		Help: "1 while this process's relay holds the lock and publishes, else 0.",
	}))
	r.m.published, errs[3] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_events_published_total",
		Help: "Order events marked published (produced and acknowledged by Kafka).",
	}))
	r.m.errors, errs[4] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_events_relay_errors_total",
		Help: "Relay rounds that failed (Kafka or PostgreSQL); the relay recovers and retries.",
	}))
	if err := errors.Join(errs[:]...); err != nil {
		r.log.Error("relay metrics not exported", "err", err)
	}
	return r, nil
}

// Run relays until ctx ends, then returns nil. Errors are counted, logged
// and retried after Interval.
func (r *Relay) Run(ctx context.Context) error {
	for {
		err := r.lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, errNotLeader) {
			r.m.errors.Inc()
			r.log.Warn("relay round failed; recovering", "err", err)
		}
		r.observe(ctx)
		if !sleep(ctx, r.cfg.Interval) {
			return nil
		}
	}
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// observe sets the backlog gauges (every relay does, leader or not).
func (r *Relay) observe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	var n int64
	var age float64
	err := r.pool.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM $1::timestamptz - min(created_at)), 0)::float8
		FROM order_events WHERE published_at IS NULL`, r.cfg.Now()).Scan(&n, &age)
	if err != nil {
		return // the next round tries again; the gauges keep their last value
	}
	r.m.pending.Set(float64(n))
	r.m.oldest.Set(max(age, 0))
}

// lead takes the lock and relays until ctx ends or an error; the lock goes
// with the connection.
func (r *Relay) lead(ctx context.Context) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("events.Relay: %w", err)
	}
	var locked bool
	defer func() {
		if locked {
			r.m.leader.Set(0) // before the lock goes: never two leaders at once
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, relayLockKey); err != nil {
				// The session may still hold the lock: close it rather
				// than hand it back to the pool.
				_ = conn.Conn().Close(uctx)
			}
		}
		conn.Release()
	}()
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, relayLockKey).Scan(&locked); err != nil {
		return fmt.Errorf("events.Relay: lock: %w", err)
	}
	if !locked {
		return errNotLeader
	}
	cl, err := kgo.NewClient(append(r.opts[:len(r.opts):len(r.opts)],
		kgo.DefaultProduceTopic(r.cfg.Topic),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(r.cfg.OpTimeout))...)
	if err != nil {
		return fmt.Errorf("events.Relay: kafka client: %w", err)
	}
	defer cl.Close()
	r.m.leader.Set(1)
	if err := r.catchUp(ctx, conn.Conn(), cl); err != nil {
		return err
	}
	var observed time.Time
	for {
		n, err := r.relayOnce(ctx, conn.Conn(), cl)
		if err != nil {
			return err
		}
		// The gauges follow a long backlog too, not only the idle rounds.
		if now := r.cfg.Now(); n == 0 || now.Sub(observed) >= time.Second {
			r.observe(ctx)
			observed = now
		}
		if n == 0 && !sleep(ctx, r.cfg.Interval) {
			return nil
		}
	}
}

// catchUp marks the events of the records past each partition's stored
// offset: produced and acknowledged, not yet marked.
func (r *Relay) catchUp(ctx context.Context, conn *pgx.Conn, cl *kgo.Client) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, r.cfg.Topic)
	if err != nil {
		return fmt.Errorf("events.Relay: recover: end offsets: %w", err)
	}
	if err := ends.Error(); err != nil {
		return fmt.Errorf("events.Relay: recover: end offsets: %w", err)
	}
	starts, err := adm.ListStartOffsets(ctx, r.cfg.Topic)
	if err != nil {
		return fmt.Errorf("events.Relay: recover: start offsets: %w", err)
	}
	if err := starts.Error(); err != nil {
		return fmt.Errorf("events.Relay: recover: start offsets: %w", err)
	}
	stored := map[int32]int64{}
	rows, err := conn.Query(ctx, `SELECT topic_partition, next_offset FROM order_event_relay_offsets WHERE topic = $1`, r.cfg.Topic)
	if err != nil {
		return fmt.Errorf("events.Relay: recover: %w", err)
	}
	for rows.Next() {
		var p int32
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			rows.Close()
			return fmt.Errorf("events.Relay: recover: %w", err)
		}
		stored[p] = o
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("events.Relay: recover: %w", err)
	}
	from := map[int32]kgo.Offset{}
	end := map[int32]int64{}
	var resetParts []int32
	var resetOffs []int64
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := stored[o.Partition]; ok && s > o.Offset {
			// The topic was re-created or truncated: its records start
			// again below the stored offset, which must follow them down,
			// or a later catch-up would skip records it must mark.
			resetParts, resetOffs = append(resetParts, o.Partition), append(resetOffs, o.Offset)
			return
		}
		at := max(stored[o.Partition], 0)
		if s, ok := starts.Lookup(o.Topic, o.Partition); ok && s.Offset > at {
			at = s.Offset // older records are gone: what is left starts here
		}
		if o.Offset > at {
			from[o.Partition] = kgo.NewOffset().At(at)
			end[o.Partition] = o.Offset
		}
	})
	if len(resetParts) > 0 {
		if _, err := conn.Exec(ctx, `UPDATE order_event_relay_offsets o SET next_offset = t.off, updated_at = now()
			FROM unnest($2::int4[], $3::int8[]) AS t(p, off) WHERE o.topic = $1 AND o.topic_partition = t.p`,
			r.cfg.Topic, resetParts, resetOffs); err != nil {
			return fmt.Errorf("events.Relay: recover: reset offsets: %w", err)
		}
		r.log.Warn("the events topic holds fewer records than the relay marked: re-created or truncated; offsets reset",
			"topic", r.cfg.Topic, "partitions", resetParts)
	}
	if len(from) == 0 {
		return nil
	}
	ids, err := r.readIDs(ctx, from, end)
	if err != nil {
		return err
	}
	n, err := r.mark(ctx, conn, ids, end)
	if err != nil {
		return fmt.Errorf("events.Relay: recover: %w", err)
	}
	r.m.published.Add(float64(n))
	r.log.Info("relay recovered published events", "partitions", len(end), "records", len(ids), "marked", n)
	return nil
}

// readIDs reads the partitions from their from offsets up to end and
// returns the event ids of their records.
func (r *Relay) readIDs(ctx context.Context, from map[int32]kgo.Offset, end map[int32]int64) ([]int64, error) {
	cl, err := kgo.NewClient(append(r.opts[:len(r.opts):len(r.opts)],
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.cfg.Topic: from}))...)
	if err != nil {
		return nil, fmt.Errorf("events.Relay: recover: kafka client: %w", err)
	}
	defer cl.Close()
	left := len(end)
	reached := map[int32]bool{}
	var ids []int64
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("events.Relay: recover: reading partitions: %w", err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = errors.Join(ferr, err) })
		if ferr != nil {
			return nil, fmt.Errorf("events.Relay: recover: reading partitions: %w", ferr)
		}
		fs.EachRecord(func(rec *kgo.Record) {
			if rec.Offset >= end[rec.Partition] || reached[rec.Partition] {
				return
			}
			if id, ok := eventID(rec); ok {
				ids = append(ids, id)
			}
			if rec.Offset+1 >= end[rec.Partition] {
				reached[rec.Partition] = true
				left--
			}
		})
	}
	return ids, nil
}

// eventID is the event id in rec's header.
func eventID(rec *kgo.Record) (int64, bool) {
	for _, h := range rec.Headers {
		if h.Key == HeaderEventID {
			id, err := strconv.ParseInt(string(h.Value), 10, 64)
			return id, err == nil
		}
	}
	return 0, false
}

// relayOnce produces the next batch of unpublished events and marks it.
func (r *Relay) relayOnce(ctx context.Context, conn *pgx.Conn, cl *kgo.Client) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	rows, err := conn.Query(ctx, `SELECT id, order_id::text, type, body::text FROM order_events
		WHERE published_at IS NULL ORDER BY id LIMIT $1`, r.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("events.Relay: read outbox: %w", err)
	}
	var recs []*kgo.Record
	var ids []int64
	for rows.Next() {
		var id int64
		var order, typ, body string
		if err := rows.Scan(&id, &order, &typ, &body); err != nil {
			rows.Close()
			return 0, fmt.Errorf("events.Relay: read outbox: %w", err)
		}
		ids = append(ids, id)
		recs = append(recs, &kgo.Record{
			Key: []byte(order), Value: []byte(body),
			Headers: []kgo.RecordHeader{
				{Key: HeaderEventID, Value: []byte(strconv.FormatInt(id, 10))},
				{Key: HeaderEventType, Value: []byte(typ)},
			},
		})
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("events.Relay: read outbox: %w", err)
	}
	if len(recs) == 0 {
		return 0, nil
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		// Some may be acknowledged: the recovery that follows finds them.
		return 0, fmt.Errorf("events.Relay: produce: %w", err)
	}
	if r.cfg.afterProduce != nil {
		if err := r.cfg.afterProduce(); err != nil {
			return 0, err
		}
	}
	next := map[int32]int64{}
	for _, rec := range recs {
		next[rec.Partition] = max(next[rec.Partition], rec.Offset+1)
	}
	n, err := r.mark(ctx, conn, ids, next)
	if err != nil {
		return 0, fmt.Errorf("events.Relay: mark: %w", err)
	}
	r.m.published.Add(float64(n))
	return len(recs), nil
}

// mark sets published_at on ids and raises the stored offsets to next, in
// one transaction; it returns how many events it marked.
func (r *Relay) mark(ctx context.Context, conn *pgx.Conn, ids []int64, next map[int32]int64) (int64, error) {
	parts := make([]int32, 0, len(next))
	offs := make([]int64, 0, len(next))
	for p, o := range next {
		parts, offs = append(parts, p), append(offs, o)
	}
	var n int64
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE order_events SET published_at = $2,
			webhook_done_at = CASE WHEN $3 THEN coalesce(webhook_done_at, $2) ELSE webhook_done_at END
			WHERE id = ANY($1::int8[]) AND published_at IS NULL`, ids, r.cfg.Now(), r.cfg.WebhookOff)
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		_, err = tx.Exec(ctx, `INSERT INTO order_event_relay_offsets (topic, topic_partition, next_offset)
			SELECT $1, p, o FROM unnest($2::int4[], $3::int8[]) AS t(p, o)
			ON CONFLICT (topic, topic_partition) DO UPDATE
			SET next_offset = greatest(order_event_relay_offsets.next_offset, excluded.next_offset), updated_at = now()`,
			r.cfg.Topic, parts, offs)
		return err
	})
	return n, err
}
