package loadtest

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// PersistReport is how fast reservations reached PostgreSQL: the order
// rows of the sale counted every PollMs from the opening to the end of the
// quiet wait (DatabaseURL runs only).
type PersistReport struct {
	PollMs int64 `json:"pollMs"`
	// Rows is the last count of order rows of the sale (any status).
	Rows int64 `json:"rows"`
	// AllPersistedMs is, relative to the opening, the first poll that saw
	// at least as many order rows as the run got 202s; -1: never seen.
	AllPersistedMs int64 `json:"allPersistedMs"`
	// LagAfterLastReservationMs is AllPersistedMs − LastReservationMs
	// (the last 202 the clients received; accurate to PollMs); -1 when
	// either is unknown.
	LagAfterLastReservationMs int64 `json:"lagAfterLastReservationMs"`
	// LastCreatedMs is the latest orders.created_at of the sale (the
	// server's reservation time) when all rows were seen, relative to the
	// opening; -1: unknown.
	LastCreatedMs int64 `json:"lastCreatedMs"`
	// LagAfterLastCreatedMs is AllPersistedMs − LastCreatedMs: the
	// server-side time from the last reservation to its row (accurate to
	// PollMs); -1 when unknown.
	LagAfterLastCreatedMs int64 `json:"lagAfterLastCreatedMs"`
	// The same from the rows themselves, read once after the polls:
	// LastInsertedMs is the latest orders.inserted_at of the sale (when
	// the writer's statement wrote the row, PostgreSQL's clock) relative to
	// the opening, and InsertedAfterLastCreatedMs is it minus the latest
	// created_at of that read. It does not depend on when a poll ran or
	// how long the load tool took to see its answer; the row's commit
	// follows within its statement. -1: unknown (see InsertedError).
	LastInsertedMs             int64  `json:"lastInsertedMs"`
	InsertedAfterLastCreatedMs int64  `json:"insertedAfterLastCreatedMs"`
	InsertedError              string `json:"insertedError,omitempty"`
	Error                      string `json:"error,omitempty"`
}

// rowSample is one poll: order rows of the sale at a time (Unix ms).
type rowSample struct {
	atMs      int64
	rows      int64
	createdMs int64 // max(created_at), Unix ms; 0: no rows
}

// orderPoller counts the sale's order rows in PostgreSQL every interval.
type orderPoller struct {
	every  time.Duration
	mu     sync.Mutex
	series []rowSample
	err    string
	last   lastRows // read once the polls stop
	done   chan struct{}
	cancel context.CancelFunc
}

// lastRows is the latest created_at and inserted_at of a sale's orders
// (Unix ms; 0: no rows), or why they could not be read.
type lastRows struct {
	createdMs, insertedMs int64
	err                   string
}

// readLastRows reads the latest created_at and inserted_at of a sale's
// orders on a connection of its own (the polls' may have been closed by
// the cancel that stopped them mid-query).
func readLastRows(ctx context.Context, url string, saleID int64) lastRows {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var l lastRows
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		defer conn.Close(context.Background())
		err = conn.QueryRow(ctx, `SELECT coalesce((extract(epoch FROM max(created_at)) * 1000)::bigint, 0),
			coalesce((extract(epoch FROM max(inserted_at)) * 1000)::bigint, 0)
			FROM orders WHERE sale_id = $1`, saleID).Scan(&l.createdMs, &l.insertedMs)
	}
	if err != nil {
		l.err = err.Error()
	}
	return l
}

// startOrderPoller polls until stop; polls start at from (the opening).
func startOrderPoller(ctx context.Context, url string, saleID int64, from time.Time, every time.Duration) *orderPoller {
	ctx, cancel := context.WithCancel(ctx)
	p := &orderPoller{every: every, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(p.done)
		if !sleepCtx(ctx, time.Until(from)-every) {
			return
		}
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := pgx.Connect(cctx, url)
		ccancel()
		if err != nil {
			p.setErr(err)
			return
		}
		defer conn.Close(context.Background())
		defer func() {
			l := readLastRows(context.WithoutCancel(ctx), url, saleID)
			p.mu.Lock()
			p.last = l
			p.mu.Unlock()
		}()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
			var n, created int64
			err := conn.QueryRow(qctx, `SELECT count(*), coalesce((extract(epoch FROM max(created_at)) * 1000)::bigint, 0)
				FROM orders WHERE sale_id = $1`, saleID).Scan(&n, &created)
			qcancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				p.setErr(err)
			} else {
				p.mu.Lock()
				p.series = append(p.series, rowSample{atMs: time.Now().UnixMilli(), rows: n, createdMs: created})
				p.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return p
}

func (p *orderPoller) setErr(err error) {
	p.mu.Lock()
	if p.err == "" {
		p.err = err.Error()
	}
	p.mu.Unlock()
}

// stop ends the polls and returns the report for reserved 202s.
func (p *orderPoller) stop(reserved, opensAtMs, lastReservationMs int64) *PersistReport {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	r := &PersistReport{PollMs: p.every.Milliseconds(), AllPersistedMs: -1, LagAfterLastReservationMs: -1,
		LastCreatedMs: -1, LagAfterLastCreatedMs: -1, LastInsertedMs: -1, InsertedAfterLastCreatedMs: -1, Error: p.err}
	switch l := p.last; {
	case l.err != "":
		r.InsertedError = l.err
	case l.insertedMs > 0:
		r.LastInsertedMs = l.insertedMs - opensAtMs
		r.InsertedAfterLastCreatedMs = l.insertedMs - l.createdMs
	}
	var createdAtAll int64
	for _, s := range p.series {
		r.Rows = s.rows
		if r.AllPersistedMs < 0 && reserved > 0 && s.rows >= reserved {
			r.AllPersistedMs = s.atMs - opensAtMs
			createdAtAll = s.createdMs
		}
	}
	if createdAtAll > 0 {
		r.LastCreatedMs = createdAtAll - opensAtMs
		r.LagAfterLastCreatedMs = r.AllPersistedMs - r.LastCreatedMs
	}
	if r.AllPersistedMs >= 0 && lastReservationMs >= 0 {
		r.LagAfterLastReservationMs = r.AllPersistedMs - lastReservationMs
	}
	return r
}
