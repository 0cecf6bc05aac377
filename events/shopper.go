package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/prom"
)

// TypeShopperAdmitted is the shopper event of a turn that came (JSON
// schema version 1, docs/shopper-event.schema.json); its kind says how.
const TypeShopperAdmitted Type = "shopper.admitted"

// ShopperEvent is one shopper event as POSTed to the webhook.
type ShopperEvent struct {
	Version int `json:"version"`
	// EventID is the outbox row id, drawn from the order events' sequence:
	// no order event has the same.
	EventID    int64     `json:"eventId"`
	Type       Type      `json:"type"`
	OccurredAt time.Time `json:"occurredAt"`
	SaleID     int64     `json:"saleId"`
	// UserID is a JSON string, as in Event.
	UserID int64              `json:"userId,string"`
	Place  int64              `json:"place"`
	Kind   flashsale.TurnKind `json:"kind"`
}

// ShopperConfig configures a Shoppers.
type ShopperConfig struct {
	// Queue is how many reports wait for the writer at most; a report that
	// finds it full is dropped. 0: 1024.
	Queue int
	// Retry is the wait before a failed write is tried again. 0: 1s.
	Retry time.Duration
	// OpTimeout bounds one read of the turns and one write. 0: 10s.
	OpTimeout time.Duration
}

// report is one call of Turns, resolved and written by Run.
type report struct {
	saleID int64
	kind   flashsale.TurnKind
	at     time.Time
	turns  func(ctx context.Context) ([]flashsale.Turn, error)
}

// Shoppers writes the shopper events of the turns the sale leaders report
// to the shopper_events outbox, which the Deliverer drains. Turns only
// queues; one goroutine, Run, resolves each report and writes it, so a
// leader's tick never waits on PostgreSQL. The wiring makes one only when
// a webhook is configured.
type Shoppers struct {
	cfg  ShopperConfig
	pool *pgxpool.Pool
	jobs chan report
	log  *slog.Logger
	m    struct {
		written prometheus.Counter
		dropped prometheus.Counter
		errors  prometheus.Counter
	}
}

// NewShoppers returns a Shoppers writing to pool.
func NewShoppers(cfg ShopperConfig, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) *Shoppers {
	if cfg.Queue <= 0 {
		cfg.Queue = 1024
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 10 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Shoppers{cfg: cfg, pool: pool, jobs: make(chan report, cfg.Queue), log: logger.With("component", "events-shoppers")}
	var errs [3]error
	s.m.written, errs[0] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_events_shopper_written_total",
		Help: "Shopper events written to the outbox (a turn reported again is not counted).",
	}))
	s.m.dropped, errs[1] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_events_shopper_batches_dropped_total",
		Help: "Turn reports not written: the writer's queue was full, or the process stopped first.",
	}))
	s.m.errors, errs[2] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_events_shopper_errors_total",
		Help: "Failed reads of a report's turns or writes of its events; the writer retries.",
	}))
	if err := errors.Join(errs[:]...); err != nil {
		s.log.Error("shopper event metrics not exported", "err", err)
	}
	return s
}

// Turns queues the events of the sale's turns that turns returns, which
// came at at (the leader's clock). It never blocks: the sale's leader
// calls it from its tick; a full queue drops the report.
func (s *Shoppers) Turns(saleID int64, kind flashsale.TurnKind, at time.Time, turns func(ctx context.Context) ([]flashsale.Turn, error)) {
	select {
	case s.jobs <- report{saleID: saleID, kind: kind, at: at, turns: turns}:
	default:
		s.m.dropped.Inc()
		s.log.Warn("shopper event queue full: turns not told to the webhook", "sale", saleID)
	}
}

// Run writes until ctx ends, then returns nil; the reports still queued
// are dropped. A report whose read or write fails is tried again after
// Retry, until ctx ends, while the queue holds the ones behind it.
func (s *Shoppers) Run(ctx context.Context) error {
	for {
		select {
		case r := <-s.jobs:
			s.handle(ctx, r)
		case <-ctx.Done():
			s.m.dropped.Add(float64(len(s.jobs)))
			return nil
		}
	}
}

// handle resolves and writes one report. The turns are read once: the
// read is of Redis, and a second one would see a queue that moved on.
func (s *Shoppers) handle(ctx context.Context, r report) {
	if ctx.Err() != nil { // taken as the stop came
		s.m.dropped.Inc()
		return
	}
	var turns []flashsale.Turn
	read := func(ctx context.Context) (err error) {
		if turns, err = r.turns(ctx); err != nil {
			return fmt.Errorf("events.Shoppers: turns: %w", err)
		}
		return nil
	}
	if !s.retry(ctx, r.saleID, read) || len(turns) == 0 {
		return
	}
	s.retry(ctx, r.saleID, func(ctx context.Context) error { return s.write(ctx, r, turns) })
}

// retry runs op, each try bounded by OpTimeout, until it succeeds (true)
// or ctx ends (false: the report is counted dropped).
func (s *Shoppers) retry(ctx context.Context, saleID int64, op func(context.Context) error) bool {
	for {
		octx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		err := op(octx)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() == nil {
			s.m.errors.Inc()
			s.log.Warn("shopper events not written; retrying", "sale", saleID, "err", err)
		}
		if !sleep(ctx, s.cfg.Retry) {
			s.m.dropped.Inc()
			return false
		}
	}
}

// write inserts the events of turns.
func (s *Shoppers) write(ctx context.Context, r report, turns []flashsale.Turn) error {
	users := make([]int64, len(turns))
	places := make([]int64, len(turns))
	for i, t := range turns {
		users[i], places[i] = t.UserID, t.Place
	}
	tag, err := s.pool.Exec(ctx, insertShopperSQL, r.saleID, string(r.kind), r.at, users, places, string(TypeShopperAdmitted))
	if err != nil {
		return fmt.Errorf("events.Shoppers: write: %w", err)
	}
	s.m.written.Add(float64(tag.RowsAffected()))
	return nil
}

// insertShopperSQL writes one event per turn, its body built by the
// migration's one definition; a (sale, place, kind) already written is
// left as it is, so a write retried after a lost answer adds nothing.
const insertShopperSQL = `INSERT INTO shopper_events (id, sale_id, user_id, place, kind, type, body)
SELECT t.id, $1, t.u, t.p, $2, $6, flashsale_shopper_event_body(t.id, $6, $3, $1, t.u, t.p, $2)
FROM (SELECT nextval('order_events_id_seq') AS id, u, p
	FROM unnest($4::int8[], $5::int8[]) AS x(u, p)) AS t
ON CONFLICT (sale_id, place, kind) DO NOTHING`
