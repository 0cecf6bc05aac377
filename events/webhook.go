package events

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/adapter/prom"
)

// Webhook request headers, beside SignatureHeader.
const (
	WebhookEventIDHeader   = "X-Flashsale-Event-Id"
	WebhookEventTypeHeader = "X-Flashsale-Event-Type"
)

// webhookLockKey is the advisory lock of the working deliverer (the relay
// holds relayLockKey).
const webhookLockKey = 726174

// Delivery results, the values of the deliveries metric's result label.
const (
	resultDelivered = "delivered" // 2xx
	resultRefused   = "refused"   // any other status
	resultFailed    = "failed"    // no answer: timeout, connection refused, ...
)

// WebhookConfig configures a Deliverer.
type WebhookConfig struct {
	// URL is the shop's endpoint (FLASHSALE_WEBHOOK_URL): http or https.
	URL string
	// Secret signs every request (FLASHSALE_WEBHOOK_SECRET); required.
	Secret []byte
	// MaxAttempts is how many failed attempts dead-letter an event
	// (FLASHSALE_WEBHOOK_MAX_ATTEMPTS). 0: DefaultWebhookMaxAttempts.
	MaxAttempts int
	// Timeout bounds one request, answer included. 0: 10s.
	Timeout time.Duration
	// Backoff is the wait after the first failure, doubled after each
	// further one up to MaxBackoff, each wait drawn between half and all of
	// it (jitter, so that many events failing together do not retry
	// together). 0: 1s and 5m.
	Backoff, MaxBackoff time.Duration
	// Interval is the wait between looks for due events when none are
	// due, and between tries of a deliverer waiting for the lock. 0: 500ms.
	Interval time.Duration
	// Parallel is how many orders' events are in flight at once (one
	// order's events always go one after the other). 0: 8.
	Parallel int
	// Now is the clock of signatures and retry times. nil: time.Now.
	Now func() time.Time
}

// DefaultWebhookMaxAttempts is WebhookConfig.MaxAttempts' default.
const DefaultWebhookMaxAttempts = 10

// CheckWebhook reports what is wrong with the webhook settings, in the
// settings' own names; an empty URL (no webhook) is fine.
func CheckWebhook(rawURL string, secret []byte, maxAttempts int) error {
	if rawURL == "" {
		return nil
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("FLASHSALE_WEBHOOK_URL=%q: want an http:// or https:// URL with a host", rawURL)
	}
	if u.User != nil {
		return errors.New("FLASHSALE_WEBHOOK_URL: credentials in the URL are refused; requests are signed with FLASHSALE_WEBHOOK_SECRET")
	}
	if len(secret) == 0 {
		return errors.New("FLASHSALE_WEBHOOK_SECRET is required when FLASHSALE_WEBHOOK_URL is set (it signs every request)")
	}
	if len(secret) < MinSecretBytes {
		return fmt.Errorf("FLASHSALE_WEBHOOK_SECRET is %d bytes: want at least %d (random; a short key can be guessed from one signed request)", len(secret), MinSecretBytes)
	}
	if maxAttempts < 0 {
		return fmt.Errorf("FLASHSALE_WEBHOOK_MAX_ATTEMPTS=%d: want a positive integer", maxAttempts)
	}
	return nil
}

// Deliverer POSTs every order event to the shop's webhook, in event id
// order per order: an order's later event waits until its earlier one was
// accepted (2xx) or dead-lettered. A failure (another status, no answer
// within the timeout) is retried with backoff; after MaxAttempts failures
// the event goes to webhook_dead_letters and the order's next events
// proceed. Each round then does the same for the shopper events
// (shopper_events, written by Shoppers), which wait for nothing and keep
// their delivery state in their own rows.
//
// One deliverer works at a time, under an advisory lock held on the
// connection it records results on. Delivery is at least once: an event
// accepted just before a crash, and not yet recorded, is sent again, with
// the same X-Flashsale-Event-Id, by which the shop deduplicates.
type Deliverer struct {
	cfg    WebhookConfig
	pool   *pgxpool.Pool
	client *http.Client
	log    *slog.Logger

	deliveries *prometheus.CounterVec
	dead       prometheus.Counter
	pending    prometheus.Gauge
	errors     prometheus.Counter
}

// NewDeliverer returns a Deliverer for cfg, or the settings' error.
func NewDeliverer(cfg WebhookConfig, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) (*Deliverer, error) {
	if cfg.URL == "" {
		return nil, errors.New("events.NewDeliverer: FLASHSALE_WEBHOOK_URL is not set")
	}
	if err := CheckWebhook(cfg.URL, cfg.Secret, cfg.MaxAttempts); err != nil {
		return nil, fmt.Errorf("events.NewDeliverer: %w", err)
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultWebhookMaxAttempts
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 8
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	d := &Deliverer{
		cfg: cfg, pool: pool, log: logger.With("component", "events-webhook"),
		client: &http.Client{
			Timeout: cfg.Timeout,
			// A redirect is an answer other than 2xx: a failure, not a
			// second request to a place the settings do not name.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	var errs [4]error
	d.deliveries, errs[0] = prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_events_webhook_deliveries_total",
		Help: "Webhook requests by result: delivered (2xx), refused (another status), failed (no answer).",
	}, []string{"result"}))
	d.dead, errs[1] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_events_webhook_dead_letters_total",
		Help: "Events dead-lettered after FLASHSALE_WEBHOOK_MAX_ATTEMPTS failures (order events to webhook_dead_letters, shopper events marked dead_at).",
	}))
	d.pending, errs[2] = prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flashsale_events_webhook_pending",
		Help: "Order and shopper events not yet accepted by the webhook nor dead-lettered.",
	}))
	d.errors, errs[3] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_events_webhook_errors_total",
		Help: "Deliverer rounds that failed on PostgreSQL; the deliverer retries.",
	}))
	if err := errors.Join(errs[:]...); err != nil {
		d.log.Error("webhook metrics not exported", "err", err)
	}
	for _, r := range []string{resultDelivered, resultRefused, resultFailed} {
		d.deliveries.WithLabelValues(r)
	}
	return d, nil
}

// Run delivers until ctx ends, then returns nil.
func (d *Deliverer) Run(ctx context.Context) error {
	for {
		err := d.lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, errNotLeader) {
			d.errors.Inc()
			d.log.Warn("webhook round failed; retrying", "err", err)
		}
		d.observe(ctx)
		if !sleep(ctx, d.cfg.Interval) {
			return nil
		}
	}
}

func (d *Deliverer) observe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int64
	if err := d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM order_events WHERE webhook_done_at IS NULL)
		+ (SELECT count(*) FROM shopper_events WHERE webhook_done_at IS NULL)`).Scan(&n); err == nil {
		d.pending.Set(float64(n))
	}
}

func (d *Deliverer) lead(ctx context.Context) error {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("events.Deliverer: %w", err)
	}
	var locked bool
	defer func() {
		if locked {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, webhookLockKey); err != nil {
				_ = conn.Conn().Close(uctx) // the session may still hold the lock
			}
		}
		conn.Release()
	}()
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, webhookLockKey).Scan(&locked); err != nil {
		return fmt.Errorf("events.Deliverer: lock: %w", err)
	}
	if !locked {
		return errNotLeader
	}
	var observed time.Time
	for {
		n, err := d.round(ctx, conn.Conn(), dueSQL, d.record)
		if err != nil {
			return err
		}
		m, err := d.round(ctx, conn.Conn(), dueShopperSQL, d.recordShoppers)
		if err != nil {
			return err
		}
		n += m
		// The gauge follows a long backlog too, not only the idle rounds.
		if now := d.cfg.Now(); n == 0 || now.Sub(observed) >= time.Second {
			d.observe(ctx)
			observed = now
		}
		if ctx.Err() != nil {
			return nil
		}
		if n == 0 && !sleep(ctx, d.cfg.Interval) {
			return nil
		}
	}
}

// due is an event whose turn it is: the first undelivered one of its order,
// past its retry time.
type due struct {
	id       int64
	typ      string
	body     []byte
	attempts int
}

// outcome is what one attempt got.
type outcome struct {
	ev     due
	status int // 0: no answer
	err    string
}

// dueSQL picks, per order, the first event not yet accepted nor
// dead-lettered, when its retry time has come.
const dueSQL = `SELECT e.id, e.type, e.body::text, coalesce(a.attempts, 0)
FROM order_events e LEFT JOIN webhook_attempts a ON a.event_id = e.id
WHERE e.webhook_done_at IS NULL
	AND NOT EXISTS (SELECT 1 FROM order_events p
		WHERE p.order_id = e.order_id AND p.webhook_done_at IS NULL AND p.id < e.id)
	AND (a.next_attempt_at IS NULL OR a.next_attempt_at <= $1)
ORDER BY e.id LIMIT $2`

// dueShopperSQL picks the shopper events not yet accepted nor
// dead-lettered, when their retry time has come: each stands alone, so
// none waits for another.
const dueShopperSQL = `SELECT id, type, body::text, attempts FROM shopper_events
WHERE webhook_done_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= $1)
ORDER BY id LIMIT $2`

// round delivers the due events dueSQL picks, Parallel at a time, and
// records the outcomes with record in one transaction; it returns how many
// it tried.
func (d *Deliverer) round(ctx context.Context, conn *pgx.Conn, dueSQL string,
	record func(context.Context, *pgx.Conn, []outcome) error) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rows, err := conn.Query(qctx, dueSQL, d.cfg.Now(), 4*d.cfg.Parallel)
	if err != nil {
		return 0, fmt.Errorf("events.Deliverer: due events: %w", err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var e due
		var body string
		err := r.Scan(&e.id, &e.typ, &body, &e.attempts)
		e.body = []byte(body)
		return e, err
	})
	if err != nil {
		return 0, fmt.Errorf("events.Deliverer: due events: %w", err)
	}
	if len(evs) == 0 {
		return 0, nil
	}
	outs := make([]outcome, len(evs))
	sem := make(chan struct{}, d.cfg.Parallel)
	var wg sync.WaitGroup
	for i, ev := range evs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			outs[i] = d.deliver(ctx, ev)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		// Shutting down: the attempts cut short are no failures of the
		// shop's; the accepted ones are recorded below all the same.
		kept := outs[:0]
		for _, o := range outs {
			if o.err == "" {
				kept = append(kept, o)
			}
		}
		outs = kept
		if len(outs) == 0 {
			return 0, nil
		}
	}
	// The outcomes are recorded even if shutdown began meanwhile: an
	// accepted event left unrecorded would be sent again.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer rcancel()
	if err := record(rctx, conn, outs); err != nil {
		return 0, fmt.Errorf("events.Deliverer: record: %w", err)
	}
	return len(evs), nil
}

// deliver makes one attempt.
func (d *Deliverer) deliver(ctx context.Context, ev due) outcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.cfg.URL, bytes.NewReader(ev.body))
	if err != nil {
		return outcome{ev: ev, err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "flashsale-webhook/1")
	req.Header.Set(WebhookEventIDHeader, strconv.FormatInt(ev.id, 10))
	req.Header.Set(WebhookEventTypeHeader, ev.typ)
	req.Header.Set(SignatureHeader, Sign(d.cfg.Secret, d.cfg.Now(), ev.body))
	resp, err := d.client.Do(req)
	if err != nil {
		d.deliveries.WithLabelValues(resultFailed).Inc()
		return outcome{ev: ev, err: err.Error()}
	}
	// Drained (a little) so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		d.deliveries.WithLabelValues(resultDelivered).Inc()
		return outcome{ev: ev, status: resp.StatusCode}
	}
	d.deliveries.WithLabelValues(resultRefused).Inc()
	return outcome{ev: ev, status: resp.StatusCode, err: resp.Status}
}

// backoff is the wait after the n-th failure (n >= 1), with jitter.
func (d *Deliverer) backoff(n int) time.Duration {
	w := d.cfg.Backoff
	for i := 1; i < n && w < d.cfg.MaxBackoff; i++ {
		w *= 2
	}
	w = min(w, d.cfg.MaxBackoff)
	return w/2 + rand.N(w/2+1)
}

// record writes the outcomes: delivered events done, failed ones
// rescheduled or, at MaxAttempts, dead-lettered.
func (d *Deliverer) record(ctx context.Context, conn *pgx.Conn, outs []outcome) error {
	now := d.cfg.Now()
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, o := range outs {
			var status *int
			if o.status != 0 {
				status = &o.status
			}
			switch n := o.ev.attempts + 1; {
			case o.err == "":
				b.Queue(`UPDATE order_events SET webhook_done_at = $2 WHERE id = $1`, o.ev.id, now)
				b.Queue(`DELETE FROM webhook_attempts WHERE event_id = $1`, o.ev.id)
			case n >= d.cfg.MaxAttempts:
				b.Queue(`INSERT INTO webhook_dead_letters (event_id, attempts, last_status, last_error, dead_at)
					VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING`, o.ev.id, n, status, o.err, now)
				b.Queue(`UPDATE order_events SET webhook_done_at = $2 WHERE id = $1`, o.ev.id, now)
				b.Queue(`DELETE FROM webhook_attempts WHERE event_id = $1`, o.ev.id)
			default:
				b.Queue(`INSERT INTO webhook_attempts (event_id, attempts, next_attempt_at, last_status, last_error)
					VALUES ($1, $2, $3, $4, $5)
					ON CONFLICT (event_id) DO UPDATE SET attempts = excluded.attempts,
						next_attempt_at = excluded.next_attempt_at, last_status = excluded.last_status,
						last_error = excluded.last_error`, o.ev.id, n, now.Add(d.backoff(n)), status, o.err)
			}
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return err
	}
	d.noteDead(outs)
	return nil
}

// noteDead logs and counts the recorded outcomes that dead-lettered their
// event.
func (d *Deliverer) noteDead(outs []outcome) {
	for _, o := range outs {
		if o.err != "" && o.ev.attempts+1 >= d.cfg.MaxAttempts {
			d.dead.Inc()
			d.log.Warn("webhook event dead-lettered", "event", o.ev.id, "type", o.ev.typ,
				"attempts", o.ev.attempts+1, "last_status", o.status, "last_error", o.err)
		}
	}
}

// recordShoppers writes the outcomes of shopper events into their rows:
// delivered ones done, failed ones rescheduled or, at MaxAttempts, done
// and dead.
func (d *Deliverer) recordShoppers(ctx context.Context, conn *pgx.Conn, outs []outcome) error {
	now := d.cfg.Now()
	b := &pgx.Batch{}
	for _, o := range outs {
		n := o.ev.attempts + 1
		var status *int
		if o.status != 0 {
			status = &o.status
		}
		var next, done, dead *time.Time
		switch {
		case o.err == "":
			done = &now
		case n >= d.cfg.MaxAttempts:
			done, dead = &now, &now
		default:
			at := now.Add(d.backoff(n))
			next = &at
		}
		b.Queue(`UPDATE shopper_events SET attempts = $2, last_status = $3, last_error = $4,
			next_attempt_at = $5, webhook_done_at = $6, dead_at = $7 WHERE id = $1`,
			o.ev.id, n, status, o.err, next, done, dead)
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
	if err != nil {
		return err
	}
	d.noteDead(outs)
	return nil
}
