// Package writer consumes flashsale.OrderPlaced messages from Kafka and writes
// them into PostgreSQL in batches.
//
// Each poll of up to Config.BatchSize records becomes one database
// transaction: a multi-row INSERT ... ON CONFLICT (id) DO NOTHING (a
// redelivered message writes no second row) and one guarded
// `UPDATE items SET sold = sold + n WHERE sold + n <= quantity` per item. When
// the database refuses the batch (the item would be oversold, or the user
// already holds another live order in the sale, which only happens after a
// Redis data loss) the batch is rolled back and split in halves until the
// refused records are isolated; the good records are still written. A refused
// record becomes an order row with status REJECTED and a stock_returns outbox
// row in one transaction; after the commit its unit goes back to Redis
// (stock.Release), the outbox row is deleted and the record is published to
// the dead-letter topic with a "reason" field.
//
// After the database commit the writer removes the pending members of the
// batch's orders in Redis (stock.Confirm) while it commits the Kafka offsets,
// so a crash before the offset commit replays the batch (harmless), and a
// crash after it may leave pending members, which the reconciler confirms
// when it finds their rows. The usual batch (every order new, every item
// within its quantity) sends BEGIN, the insert and the update in one round
// trip; anything else is rolled back and written by the general path.
//
// The database load is bounded: one batch transaction at a time on one
// connection of a pool the caller sizes with Config.MaxConns, every Begin has
// a deadline (Config.TxTimeout), and the batch size is configurable.
package writer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/stock"
)

// Config configures a Writer. Zero values take the defaults.
type Config struct {
	Brokers         []string // Kafka seed brokers (required)
	Topic           string   // default flashsale.TopicOrders
	DeadLetterTopic string   // default flashsale.TopicDeadLetter
	Group           string   // consumer group, default "flashsale-writer"

	// BatchSize is the most orders written in one database transaction
	// (and polled from Kafka at once). Default 500.
	BatchSize int
	// MaxConns caps the PostgreSQL connections of the writer's process.
	// The writer itself runs one statement at a time (one batch
	// transaction, then the outbox cleanup), so it holds one connection;
	// the caller opens the pool with postgres.Config.MaxConns = MaxConns so
	// the writer can never take more of a database shared with the regular
	// shop (New logs a warning when the pool is larger). Default 4.
	MaxConns int32
	// PaymentWindow sets expires_at = created_at + PaymentWindow.
	// Default 10m.
	PaymentWindow time.Duration
	// TxTimeout bounds each database transaction, including the wait for a
	// pooled connection (pgx waits forever without one). Default 10s.
	TxTimeout time.Duration
	// Now is the clock (nil: time.Now); used for orders whose message has
	// no createdAtMs.
	Now func() time.Time

	// afterDBCommit, when set (tests), runs after a batch's database commit
	// and before anything else; a non-nil error stops Run at once, as a
	// crash would: no Redis confirm, no dead letters, no offset commit.
	afterDBCommit func() error
}

// Reject reasons stored in orders.reject_reason and in the dead-letter
// record's "reason" field.
const (
	ReasonSoldOut          = "SOLD_OUT"          // the database has no unit left for the item
	ReasonAlreadyPurchased = "ALREADY_PURCHASED" // the user holds another live order in the sale
	ReasonUnknownItem      = "UNKNOWN_ITEM"      // no such item in this sale (no order row can be written)
	ReasonInvalid          = "INVALID"           // the database refused the values (no order row)
	ReasonUndecodable      = "UNDECODABLE"       // not an OrderPlaced message
)

func (c *Config) defaults() error {
	if len(c.Brokers) == 0 {
		return errors.New("no Kafka brokers")
	}
	if c.Topic == "" {
		c.Topic = flashsale.TopicOrders
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = flashsale.TopicDeadLetter
	}
	if c.Group == "" {
		c.Group = "flashsale-writer"
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 4
	}
	if c.PaymentWindow <= 0 {
		c.PaymentWindow = 10 * time.Minute
	}
	if c.TxTimeout <= 0 {
		c.TxTimeout = 10 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Writer is the Kafka → PostgreSQL order writer.
type Writer struct {
	cfg   Config
	pool  *pgxpool.Pool
	stock *stock.Store
	log   *slog.Logger
	cl    *kgo.Client
	m     metrics
	lag   map[topicPartition]int64
	close sync.Once
}

type topicPartition struct {
	topic     string
	partition int32
}

type metrics struct {
	written, duplicate, rejected, undecodable prometheus.Counter
	batch                                     prometheus.Histogram
	lag                                       prometheus.Gauge
	// transactions by path: "one_round_trip" (insertAllNew) or "general"
	oneTrip, general prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	orders := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_writer_orders_total",
		Help: "Order messages handled by the writer, by outcome.",
	}, []string{"outcome"})
	txs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_writer_transactions_total",
		Help: "Database transactions of the writer, by path: one_round_trip (every order new, BEGIN, insert and update sent together) or general.",
	}, []string{"path"})
	m := metrics{
		oneTrip:     txs.WithLabelValues("one_round_trip"),
		general:     txs.WithLabelValues("general"),
		written:     orders.WithLabelValues("written"),
		duplicate:   orders.WithLabelValues("duplicate"),
		rejected:    orders.WithLabelValues("rejected"),
		undecodable: orders.WithLabelValues("undecodable"),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashsale_writer_batch_seconds",
			Help:    "Time to write one polled batch: database, Redis confirm, dead letters and offset commit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_writer_lag",
			Help: "Records behind the partitions' high watermarks at the last poll.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{orders, txs, m.batch, m.lag} {
			if err := reg.Register(c); err != nil {
				return metrics{}, err
			}
		}
	}
	return m, nil
}

// New returns a Writer consuming cfg.Topic in cfg.Group. It creates the
// Kafka client but does not consume until Run. reg may be nil.
func New(cfg Config, pool *pgxpool.Pool, st *stock.Store, logger *slog.Logger, reg prometheus.Registerer) (*Writer, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("writer.New: %w", err)
	}
	if pool == nil || st == nil {
		return nil, errors.New("writer.New: nil pool or stock store")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("writer.New: %w", err)
	}
	if pc := pool.Config(); pc != nil && pc.MaxConns > cfg.MaxConns {
		logger.Warn("writer: the pool is larger than Config.MaxConns; open it with postgres.Config.MaxConns = Config.MaxConns",
			"component", "writer", "pool_max_conns", pc.MaxConns, "max_conns", cfg.MaxConns)
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.DisableAutoCommit(),
		// No rebalance between a poll and the commit of its offsets, so
		// the writer never commits for a partition it lost.
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchMaxWait(250*time.Millisecond),
		kgo.RecordDeliveryTimeout(30*time.Second), // bound dead-letter produces
	)
	if err != nil {
		return nil, fmt.Errorf("writer.New: %w", err)
	}
	return &Writer{
		cfg:   cfg,
		pool:  pool,
		stock: st,
		log:   logger.With("component", "writer"),
		cl:    cl,
		m:     m,
		lag:   map[topicPartition]int64{},
	}, nil
}

// Close closes the Kafka client (leaving the group without committing).
// Call it after Run returned.
func (w *Writer) Close() error {
	w.close.Do(w.cl.CloseAllowingRebalance)
	return nil
}

// pollWait bounds one poll so that the lag gauge settles at 0 when idle.
const pollWait = time.Second

// Run consumes until ctx ends and returns nil then. On cancellation it
// finishes the batch in hand (database, Redis, dead letters) and commits its
// offsets before returning. It returns an error only when it had to stop
// without finishing a batch for another reason (the batch is then delivered
// again to the group).
func (w *Writer) Run(ctx context.Context) error {
	w.log.Info("writer started", "topic", w.cfg.Topic, "group", w.cfg.Group, "batch_size", w.cfg.BatchSize)
	defer w.log.Info("writer stopped")
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, pollWait)
		fs := w.cl.PollRecords(pctx, w.cfg.BatchSize)
		cancel()
		if fs.IsClientClosed() {
			return nil
		}
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			w.log.Warn("kafka fetch error", "topic", topic, "partition", p, "err", err)
		})
		recs := fs.Records()
		w.updateLag(fs, len(recs) == 0)
		if len(recs) > 0 {
			if err := w.process(ctx, recs); err != nil {
				w.cl.AllowRebalance()
				if ctx.Err() != nil {
					w.log.Warn("shutdown before a batch could be written; it will be delivered again", "err", err)
					return nil
				}
				return fmt.Errorf("writer.Run: %w", err)
			}
		}
		w.cl.AllowRebalance()
	}
	return nil
}

func (w *Writer) updateLag(fs kgo.Fetches, idle bool) {
	if idle {
		// Nothing new since the last poll, whose records are written.
		clear(w.lag)
		w.m.lag.Set(0)
		return
	}
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		last := p.Records[len(p.Records)-1].Offset
		lag := max(p.HighWatermark-last-1, 0)
		w.lag[topicPartition{p.Topic, p.Partition}] = lag
	})
	var sum int64
	for _, l := range w.lag {
		sum += l
	}
	w.m.lag.Set(float64(sum))
}

// process writes one polled batch and commits its offsets.
func (w *Writer) process(ctx context.Context, recs []*kgo.Record) error {
	start := time.Now()
	// The batch in hand is finished even when ctx ends (graceful
	// shutdown); each step below has its own deadline.
	work := context.WithoutCancel(ctx)

	orders := make([]*order, 0, len(recs))
	seen := make(map[string]bool, len(recs))
	var dead []deadLetter
	var dups []*order
	for _, r := range recs {
		o, err := decode(r.Value, w.cfg.Now, w.cfg.PaymentWindow)
		if err != nil {
			w.log.Error("undecodable order message, dead-lettered", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
			w.m.undecodable.Inc()
			dead = append(dead, deadLetter{rec: r, reason: ReasonUndecodable})
			continue
		}
		o.rec = r
		if seen[o.msg.OrderID] {
			dups = append(dups, o) // the same message twice in one poll
			continue
		}
		seen[o.msg.OrderID] = true
		orders = append(orders, o)
	}

	var res result
	if len(orders) > 0 {
		if err := w.store(ctx, work, orders, &res); err != nil {
			return err
		}
		if len(res.rejected) > 0 {
			if err := w.reject(ctx, work, &res); err != nil {
				return err
			}
		}
	}
	if w.cfg.afterDBCommit != nil {
		if err := w.cfg.afterDBCommit(); err != nil {
			return err
		}
	}
	res.duplicate = append(res.duplicate, dups...)
	w.adoptUnfinished(work, &res)

	// Redis: the committed orders are no longer pending. A failure here is
	// not fatal: the reconciler finds the member, sees the row and confirms.
	confirm := make([]stock.Pending, 0, len(res.written)+len(res.duplicate))
	for _, list := range [][]*order{res.written, res.duplicate} {
		for _, o := range list {
			confirm = append(confirm, stock.Pending{SaleID: o.msg.SaleID, OrderID: o.msg.OrderID, UserID: o.msg.UserID, ItemID: o.msg.ItemID})
		}
	}
	// It runs while the rest of the batch's work goes on: nothing below
	// depends on it, and under a crowd each round trip is one more wait
	// before the next batch.
	var confirmed sync.WaitGroup
	confirmed.Go(func() {
		rctx, cancel := context.WithTimeout(work, 5*time.Second)
		defer cancel()
		if err := w.stock.Confirm(rctx, confirm); err != nil {
			w.log.Warn("confirming pending reservations in Redis failed; the reconciler will", "orders", len(confirm), "err", err)
		}
	})

	w.releaseRejected(work, &res)
	for _, rj := range res.rejected {
		if rj.fresh {
			dead = append(dead, deadLetter{rec: rj.o.rec, order: &rj.o.msg, reason: rj.reason})
		}
	}
	w.publishDead(work, dead)

	cctx, cancel := context.WithTimeout(work, 10*time.Second)
	err := w.cl.CommitRecords(cctx, recs...)
	cancel()
	if err != nil {
		// The batch is in the database; a redelivery is harmless.
		w.log.Warn("committing Kafka offsets failed; the batch may be delivered again", "records", len(recs), "err", err)
	}

	confirmed.Wait()
	w.m.written.Add(float64(len(res.written)))
	w.m.duplicate.Add(float64(len(res.duplicate)))
	w.m.rejected.Add(float64(len(res.rejected)))
	w.m.batch.Observe(time.Since(start).Seconds())
	return nil
}

type deadLetter struct {
	rec    *kgo.Record
	order  *flashsale.OrderPlaced // nil: undecodable, the original value is kept
	reason string
}

// publishDead produces the dead letters and waits for them. A failure is
// logged, not retried forever: the database row (REJECTED) is the record of
// truth, the dead-letter topic a notification.
func (w *Writer) publishDead(ctx context.Context, dead []deadLetter) {
	if len(dead) == 0 {
		return
	}
	recs := make([]*kgo.Record, 0, len(dead))
	for _, d := range dead {
		value := d.rec.Value
		if d.order != nil {
			value = deadLetterValue(*d.order, d.reason)
		}
		recs = append(recs, &kgo.Record{
			Topic: w.cfg.DeadLetterTopic,
			Key:   d.rec.Key,
			Value: value,
			Headers: []kgo.RecordHeader{
				{Key: "reason", Value: []byte(d.reason)},
				{Key: "source", Value: []byte(d.rec.Topic + "/" + strconv.Itoa(int(d.rec.Partition)) + "/" + strconv.FormatInt(d.rec.Offset, 10))},
			},
		})
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := w.cl.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		w.log.Error("publishing dead letters failed", "records", len(recs), "err", err)
	}
}
