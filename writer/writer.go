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
// (redisstock.Release), the outbox row is deleted and the record is published to
// the dead-letter topic with a "reason" field.
//
// After the database commit the writer removes the pending members of the
// batch's orders in Redis (redisstock.Confirm) while it commits the Kafka offsets,
// so a crash before the offset commit replays the batch (harmless), and a
// crash after it may leave pending members, which the reconciler confirms
// when it finds their rows. The usual batch (every order new, every item
// within its quantity) is one statement committed on its own, one round
// trip (orderstore.Store.Place, the order store every order change goes
// through); anything else is rolled back and written by the
// general path.
//
// The database load is bounded: at most Config.InFlight batch transactions
// at a time (default 2, each on its own connection) of a pool the caller
// sizes with Config.MaxConns, every Begin has a deadline (Config.TxTimeout),
// and the batch size is configurable. What follows a commit (Redis confirm,
// dead letters, offsets) goes batch by batch in poll order, so the committed
// offsets never pass a batch that is not in the database.
//
// Faults: a writer killed without leaving the group holds its partitions for
// Config.SessionTimeout (or gives them back at once to a writer restarted
// with the same Config.InstanceID); one that is stopped leaves the group in
// Close. A broker re-created empty on the same address (new topic IDs) is
// followed: the writer purges the orders topic from its client and consumes
// it again.
package writer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/adapter/prom"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// Config configures a Writer. Zero values take the defaults.
type Config struct {
	Brokers         []string       // Kafka seed brokers (required)
	Security        kafka.Security // TLS and SASL to the brokers
	Topic           string         // default flashsale.TopicOrders
	DeadLetterTopic string         // default flashsale.TopicDeadLetter
	Group           string         // consumer group, default "flashsale-writer"

	// BatchSize is the most orders written in one database transaction
	// (and polled from Kafka at once). Default 500.
	BatchSize int
	// InFlight is the most polled batches whose database transactions run
	// at once, each on a connection of its own (keep MaxConns above it).
	// Under a crowd each transaction mostly waits (for the database
	// process's turn on a CPU, a commit's flush, a round trip); a second
	// one overlaps those waits. Default 2.
	InFlight int
	// MaxConns caps the PostgreSQL connections of the writer's process.
	// The writer holds one connection per batch in flight (InFlight) and
	// one for the rejections' clean-up; the caller opens the pool with
	// postgres.Config.MaxConns = MaxConns so the writer can never take more
	// of a database shared with the regular shop (New logs a warning when
	// the pool is larger). Default 4.
	MaxConns int32
	// FetchWait is the longest the broker holds a fetch for more records
	// when fewer than about a batch (BatchSize × 128 bytes) are waiting.
	// Without it a fetch sent the moment a poll took the one before is
	// answered with the first record that arrives, so a steady stream
	// would be written an order or two per transaction.
	// Default 50ms: the most it adds to an order's way into the database.
	FetchWait time.Duration
	// PaymentWindow sets expires_at = created_at + PaymentWindow.
	// Default 10m.
	PaymentWindow time.Duration
	// TxTimeout bounds each database transaction, including the wait for a
	// pooled connection (pgx waits forever without one). Default 10s.
	TxTimeout time.Duration
	// SessionTimeout is the group session timeout (default 6s, the least
	// a Kafka broker accepts by default, group.min.session.timeout.ms): a
	// writer killed without leaving the group holds its partitions that
	// long before the group gives them to a restarted or another writer.
	// The heartbeat goes at a third of it.
	SessionTimeout time.Duration
	// InstanceID, when set, makes the writer a static member of the group
	// (KIP-345): a writer restarted with the same id takes its partitions
	// back at once, without waiting for the session timeout. Give each
	// writer process its own, stable id; leave it empty for dynamic
	// membership.
	InstanceID string
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
	// ReasonLostWithRedis: a reservation of a Redis that lost its data,
	// whose record landed after the stock's rebuild counted the orders
	// topic (orderstore.Fence): its unit was counted as unsold.
	ReasonLostWithRedis = "LOST_WITH_REDIS"
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
	if c.InFlight <= 0 {
		c.InFlight = 2
	}
	if c.FetchWait <= 0 {
		c.FetchWait = 50 * time.Millisecond
	}
	c.InFlight = min(c.InFlight, int(c.MaxConns))
	if c.PaymentWindow <= 0 {
		c.PaymentWindow = 10 * time.Minute
	}
	if c.TxTimeout <= 0 {
		c.TxTimeout = 10 * time.Second
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// DefaultSessionTimeout is Config.SessionTimeout's default.
const DefaultSessionTimeout = 6 * time.Second

// Writer is the Kafka → PostgreSQL order writer.
type Writer struct {
	cfg    Config
	orders *orderstore.Store
	stock  *redisstock.Store
	log    *slog.Logger
	cl     *kgo.Client
	m      metrics
	lag    map[topicPartition]int64
	close  sync.Once
	// rebalance is set when the group waits for the writer to let a
	// rebalance go on (BlockRebalanceOnPoll): Run stops polling until the
	// batches in hand are finished.
	rebalance atomic.Bool
	// lastReadopt spaces readopt calls (Run's goroutine only).
	lastReadopt time.Time
}

type topicPartition struct {
	topic     string
	partition int32
}

type metrics struct {
	written, duplicate, rejected, undecodable prometheus.Counter
	batch, batchRecords                       prometheus.Histogram
	lag                                       prometheus.Gauge
	// transactions by path: "one_round_trip" (orderstore.Store.Place's one
	// statement) or "general"
	oneTrip, general prometheus.Counter
	// a batch's wall time by stage: its database transactions, the Redis
	// confirm and the Kafka offset commit (the last two run together)
	dbStage, confirmStage, commitStage prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	orders := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_writer_orders_total",
		Help: "Order messages handled by the writer, by outcome.",
	}, []string{"outcome"})
	txs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_writer_transactions_total",
		Help: "Database transactions of the writer, by path: one_round_trip (every order new: insert and update as one statement) or general.",
	}, []string{"path"})
	stages := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "flashsale_writer_stage_seconds",
		Help:    "Wall time of one batch's stages: database (its transactions), redis_confirm, offset_commit (the last two run together).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	}, []string{"stage"})
	// Several writers on one registry share the collectors.
	var errs [6]error
	orders, errs[0] = prom.Register(reg, orders)
	txs, errs[1] = prom.Register(reg, txs)
	stages, errs[2] = prom.Register(reg, stages)
	m := metrics{
		dbStage:      stages.WithLabelValues("database"),
		confirmStage: stages.WithLabelValues("redis_confirm"),
		commitStage:  stages.WithLabelValues("offset_commit"),
		oneTrip:      txs.WithLabelValues("one_round_trip"),
		general:      txs.WithLabelValues("general"),
		written:      orders.WithLabelValues("written"),
		duplicate:    orders.WithLabelValues("duplicate"),
		rejected:     orders.WithLabelValues("rejected"),
		undecodable:  orders.WithLabelValues("undecodable"),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashsale_writer_batch_seconds",
			Help:    "Time from a batch's poll to its offset commit: database, the wait for the batches polled before it, Redis confirm, dead letters.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		batchRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashsale_writer_batch_records",
			Help:    "Records in one polled batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flashsale_writer_lag",
			Help: "Records behind the partitions' high watermarks at the last poll.",
		}),
	}
	m.batch, errs[3] = prom.Register(reg, m.batch)
	m.batchRecords, errs[4] = prom.Register(reg, m.batchRecords)
	m.lag, errs[5] = prom.Register(reg, m.lag)
	if err := errors.Join(errs[:]...); err != nil {
		return metrics{}, err
	}
	return m, nil
}

// New returns a Writer consuming cfg.Topic in cfg.Group. It creates the
// Kafka client but does not consume until Run. reg may be nil.
func New(cfg Config, pool *pgxpool.Pool, st *redisstock.Store, logger *slog.Logger, reg prometheus.Registerer) (*Writer, error) {
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
	w := &Writer{
		cfg:    cfg,
		orders: orderstore.New(pool),
		stock:  st,
		log:    logger.With("component", "writer"),
		m:      m,
		lag:    map[topicPartition]int64{},
	}
	opts, err := kafka.ClientOpts(cfg.Brokers, cfg.Security, w.log)
	if err != nil {
		return nil, fmt.Errorf("writer.New: %w", err)
	}
	opts = append(opts,
		kgo.ConsumerGroup(cfg.Group),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.HeartbeatInterval(max(cfg.SessionTimeout/3, 100*time.Millisecond)),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.DisableAutoCommit(),
		// No rebalance between a poll and the commit of its offsets, so
		// the writer never commits for a partition it lost.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { w.rebalance.Store(true) }),
		kgo.FetchMaxWait(cfg.FetchWait),
		kgo.FetchMinBytes(int32(min(cfg.BatchSize*128, 1<<20))),
		kgo.RecordDeliveryTimeout(30*time.Second), // bound dead-letter produces
		// A re-created topic (UNKNOWN_TOPIC_ID) reaches Run at its first
		// fetch, not after franz-go's retries, so readopt runs at once.
		kgo.KeepRetryableFetchErrors(),
	)
	if cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(cfg.InstanceID))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("writer.New: %w", err)
	}
	w.cl = cl
	return w, nil
}

// Close closes the Kafka client, leaving the group (a dynamic member sends
// LeaveGroup, so its partitions go to another writer at once) without
// committing more. Call it after Run returned.
func (w *Writer) Close() error {
	w.close.Do(w.cl.CloseAllowingRebalance)
	return nil
}

// pollWait bounds one poll so that the lag gauge settles at 0 when idle.
const pollWait = time.Second

// batch is one polled batch on its way: its database work runs in a
// goroutine of its own (write), the rest (finish) in Run, in poll order.
type batch struct {
	recs  []*kgo.Record
	start time.Time
	// written is canceled when write has returned: res, dead and err are
	// then set and no longer change.
	written context.Context
	done    context.CancelFunc
	res     result
	dead    []deadLetter
	err     error
}

// Run consumes until ctx ends and returns nil then. Up to Config.InFlight
// polled batches have their database transactions running at once, each on
// its own connection; what follows a batch's commit (the Redis confirm, dead
// letters, the offset commit) is done one batch at a time in poll order, so
// the committed offsets never pass a batch that is not in the database. On
// cancellation it stops polling, finishes the batches in hand and commits
// their offsets before returning. It returns an error only when it had to
// stop without finishing a batch for another reason (the batch, and those
// polled after it, are then delivered again to the group).
func (w *Writer) Run(ctx context.Context) error {
	w.log.Info("writer started", "topic", w.cfg.Topic, "group", w.cfg.Group, "batch_size", w.cfg.BatchSize, "in_flight", w.cfg.InFlight)
	defer w.log.Info("writer stopped")
	var (
		inFlight []*batch
		writers  sync.WaitGroup
	)
	// Every write goroutine has ended when Run returns; when Run stops on
	// an error, the others stop retrying (their batches are delivered
	// again).
	defer writers.Wait()
	writeCtx, stopWrites := context.WithCancel(ctx)
	defer stopWrites()
	for {
		// Finish the written batches at the head, in poll order.
		for len(inFlight) > 0 && inFlight[0].written.Err() != nil {
			b := inFlight[0]
			inFlight = inFlight[1:]
			if b.err != nil {
				if ctx.Err() != nil {
					w.log.Warn("shutdown before a batch could be written; it will be delivered again", "err", b.err)
					return nil
				}
				return fmt.Errorf("writer.Run: %w", b.err)
			}
			w.finish(ctx, b)
		}
		if len(inFlight) == 0 {
			// Nothing of the group's is in hand: a rebalance may go on.
			w.rebalance.Store(false)
			w.cl.AllowRebalance()
		}
		if ctx.Err() != nil && len(inFlight) == 0 {
			return nil
		}
		if ctx.Err() != nil || len(inFlight) == w.cfg.InFlight || (len(inFlight) > 0 && w.rebalance.Load()) {
			// Full, stopping, or a rebalance waits for the batches in
			// hand: no new poll until the oldest batch is written.
			<-inFlight[0].written.Done()
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, pollWait)
		stop := func() bool { return false }
		if len(inFlight) > 0 {
			// The oldest batch's finish does not wait for records.
			stop = context.AfterFunc(inFlight[0].written, cancel)
		}
		fs := w.cl.PollRecords(pctx, w.cfg.BatchSize)
		stop()
		cancel()
		if fs.IsClientClosed() {
			for _, b := range inFlight {
				<-b.written.Done()
			}
			return nil
		}
		recreated := false
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			if errors.Is(err, kerr.UnknownTopicID) {
				recreated = true
			} else if kerr.IsRetriable(err) {
				// franz-go retries these itself (a moved leader, a broker
				// briefly away).
				w.log.Debug("kafka fetch error, retried", "topic", topic, "partition", p, "err", err)
				return
			}
			w.log.Warn("kafka fetch error", "topic", topic, "partition", p, "err", err)
		})
		if recreated {
			w.readopt()
		}
		recs := fs.Records()
		w.updateLag(fs, len(recs) == 0 && len(inFlight) == 0)
		if len(recs) > 0 {
			b := &batch{recs: recs, start: time.Now()}
			b.written, b.done = context.WithCancel(context.WithoutCancel(ctx))
			inFlight = append(inFlight, b)
			writers.Go(func() {
				defer b.done()
				b.err = w.write(writeCtx, b)
			})
		}
	}
}

// readopt makes the client forget the orders topic and consume it again. A
// broker re-created empty on the same address (the embedded broker without
// its data directory) gives its topics new IDs; franz-go keeps the first ID
// it saw and answers UNKNOWN_TOPIC_ID until the topic is purged and added
// back. The group then rebalances; offsets of batches in hand may fail to
// commit, and those batches are delivered again (harmless).
func (w *Writer) readopt() {
	now := time.Now()
	if now.Sub(w.lastReadopt) < time.Second {
		return
	}
	w.lastReadopt = now
	w.log.Warn("the orders topic was re-created (new topic ID); consuming it again", "topic", w.cfg.Topic)
	w.cl.PurgeTopicsFromClient(w.cfg.Topic)
	w.cl.AddConsumeTopics(w.cfg.Topic)
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

// write decodes a polled batch and writes it into the database (b.res,
// b.dead). ctx ending stops its retries (shutdown); each step has its own
// deadline.
func (w *Writer) write(ctx context.Context, b *batch) error {
	work := context.WithoutCancel(ctx)
	recs := b.recs

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

	// The same order as every other in-flight batch's: two transactions
	// that wait for each other's rows (the same message delivered twice)
	// take them in the same order. Stable: a user's orders keep theirs.
	slices.SortStableFunc(orders, func(a, b *order) int {
		return cmp.Or(cmp.Compare(a.msg.SaleID, b.msg.SaleID), cmp.Compare(a.msg.UserID, b.msg.UserID))
	})
	res := &b.res
	dbStart := time.Now()
	if len(orders) > 0 {
		if err := w.store(ctx, work, orders, res); err != nil {
			return err
		}
		if len(res.rejected) > 0 {
			if err := w.reject(ctx, work, res); err != nil {
				return err
			}
		}
	}
	observeSince(w.m.dbStage, dbStart)
	if w.cfg.afterDBCommit != nil {
		if err := w.cfg.afterDBCommit(); err != nil {
			return err
		}
	}
	res.duplicate = append(res.duplicate, dups...)
	w.adoptUnfinished(work, res)
	b.dead = dead
	return nil
}

// finish does what follows a written batch's database commit: the Redis
// confirm, the release of rejected units, dead letters and the offset
// commit. It runs even when ctx has ended (graceful shutdown); each step has
// its own deadline.
func (w *Writer) finish(ctx context.Context, b *batch) {
	work := context.WithoutCancel(ctx)
	res, dead, recs := &b.res, b.dead, b.recs

	// Redis: the committed orders are no longer pending. A failure here is
	// not fatal: the reconciler finds the member, sees the row and confirms.
	confirm := make([]redisstock.Pending, 0, len(res.written)+len(res.duplicate))
	for _, list := range [][]*order{res.written, res.duplicate} {
		for _, o := range list {
			confirm = append(confirm, redisstock.Pending{SaleID: o.msg.SaleID, OrderID: o.msg.OrderID, UserID: o.msg.UserID, ItemID: o.msg.ItemID})
		}
	}
	// It runs while the rest of the batch's work goes on: nothing below
	// depends on it, and under a crowd each round trip is one more wait
	// before the next batch.
	var confirmed sync.WaitGroup
	confirmed.Go(func() {
		defer observeSince(w.m.confirmStage, time.Now())
		rctx, cancel := context.WithTimeout(work, 5*time.Second)
		defer cancel()
		if err := w.stock.Confirm(rctx, confirm); err != nil {
			w.log.Warn("confirming pending reservations in Redis failed; the reconciler will", "orders", len(confirm), "err", err)
		}
	})

	w.releaseRejected(work, res)
	for _, rj := range res.rejected {
		if rj.fresh {
			dead = append(dead, deadLetter{rec: rj.o.rec, order: &rj.o.msg, reason: rj.reason})
		}
	}
	w.publishDead(work, dead)

	cctx, cancel := context.WithTimeout(work, 10*time.Second)
	commitStart := time.Now()
	err := w.cl.CommitRecords(cctx, recs...)
	observeSince(w.m.commitStage, commitStart)
	cancel()
	if err != nil {
		// The batch is in the database; a redelivery is harmless.
		w.log.Warn("committing Kafka offsets failed; the batch may be delivered again", "records", len(recs), "err", err)
	}

	confirmed.Wait()
	w.m.written.Add(float64(len(res.written)))
	w.m.duplicate.Add(float64(len(res.duplicate)))
	w.m.rejected.Add(float64(len(res.rejected)))
	observeSince(w.m.batch, b.start)
	w.m.batchRecords.Observe(float64(len(recs)))
}

func observeSince(o prometheus.Observer, start time.Time) {
	o.Observe(time.Since(start).Seconds())
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
		if errors.Is(err, kerr.UnknownTopicID) {
			// Re-created under a new ID: the next produce finds it again.
			w.cl.PurgeTopicsFromClient(w.cfg.DeadLetterTopic)
		}
	}
}
