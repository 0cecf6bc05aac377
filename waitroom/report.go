package waitroom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
)

// The report's roll-up (migration 0013): each gateway counts, per sale and
// minute, what its room sees, in memory and with no Redis work of its own,
// and writes its figures so far for the minute every Config.ReportEvery
// and when it stops. The rows are read back summed over the gateways
// (PGReport.RoomReport).

// waitBoundsMs are the upper bounds, in milliseconds, of the wait
// histogram's buckets; a last bucket holds the waits above the last bound.
// A percentile is reported as its bucket's bound, so its resolution is the
// bucket's width: a quarter of a second under a second, then roughly a
// doubling (docs/OPERATIONS.md).
var waitBoundsMs = [...]int64{250, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 60_000,
	120_000, 300_000, 600_000, 1_200_000, 1_800_000, 3_600_000}

// waitBuckets is the histogram's length: one per bound and the overflow.
const waitBuckets = len(waitBoundsMs) + 1

// Refusal rules a join can be refused by (the report's refusals).
const (
	RuleBlocklist    = "blocklist"          // BLOCKED by the defense's blocklist
	RuleIdentity     = "identity"           // DUPLICATE_IDENTITY
	RuleConnsPerUser = "connectionsPerUser" // too many WebSockets of one user
	RuleAccess       = "access"             // the sale's access rule (NOT_INVITED, CODE_INVALID, CODE_USED, NOT_YET)
)

// minuteTally is one gateway's figures of one sale in one minute.
type minuteTally struct {
	seq, serving, prequeue int64
	holds                  int64
	refusals               map[string]int64
	shadowed               map[string]int64
	waits                  [waitBuckets]int64
	waitMin, waitMax       int64 // -1: no wait seen
	// ver counts changes; a flush clears the row's dirt only if none
	// came while it wrote.
	ver, flushed uint64
}

type tallyKey struct {
	sale   int64
	minute int64 // Unix seconds of the minute's start
}

// tally is a gateway's report figures not yet written, the current
// minute's and any older one a failed write left.
type tally struct {
	mu   sync.Mutex
	rows map[tallyKey]*minuteTally
	// last is the queue each sale was last seen at: an unchanged queue
	// makes no row, so a quiet sale writes nothing.
	last map[int64]queueState
}

func newTally() *tally {
	return &tally{rows: map[tallyKey]*minuteTally{}, last: map[int64]queueState{}}
}

// row returns the sale's row for the minute of now, made if missing.
// Called with t.mu held.
func (t *tally) row(sale int64, now time.Time) *minuteTally {
	k := tallyKey{sale, now.Unix() - now.Unix()%60}
	m := t.rows[k]
	if m == nil {
		m = &minuteTally{prequeue: -1, waitMin: -1, waitMax: -1}
		if st, ok := t.last[sale]; ok {
			m.seq, m.serving, m.prequeue = st.Seq, st.Serving, st.N
		}
		t.rows[k] = m
	}
	m.ver++
	return m
}

// queue records a reading of the sale's queue.
func (t *tally) queue(sale int64, now time.Time, st queueState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// A reading never goes down (a restored queue may lag what was seen).
	if last, ok := t.last[sale]; ok {
		if st.Seq <= last.Seq && st.Serving <= last.Serving && st.N <= last.N {
			return
		}
		st.Seq, st.Serving, st.N = max(st.Seq, last.Seq), max(st.Serving, last.Serving), max(st.N, last.N)
	}
	m := t.row(sale, now)
	t.last[sale] = st
	m.seq, m.serving, m.prequeue = max(m.seq, st.Seq), max(m.serving, st.Serving), max(m.prequeue, st.N)
}

// held counts n places admitted with a held unit.
func (t *tally) held(sale int64, now time.Time, n int64) {
	if n <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.row(sale, now).holds += n
}

// refused counts a join refused by rule.
func (t *tally) refused(sale int64, now time.Time, rule string) { t.byRule(sale, now, rule, false) }

// shadowed counts a shopper sent to the shadow queue by rule.
func (t *tally) shadowed(sale int64, now time.Time, rule string) { t.byRule(sale, now, rule, true) }

// byRule counts one refusal, or one shadowing, by rule.
func (t *tally) byRule(sale int64, now time.Time, rule string, shadow bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.row(sale, now)
	counts := &m.refusals
	if shadow {
		counts = &m.shadowed
	}
	if *counts == nil {
		*counts = map[string]int64{}
	}
	(*counts)[rule]++
}

// waitSlack is how long before a join on a connection its admission may
// have been recorded and still be this join's: the tick that admits a
// place records the time it started, which can precede a join it admits
// in the same tick.
const waitSlack = 5 * time.Second

// waited counts an admission at atMs of a shopper who joined at joinedMs
// (Unix ms), as a wait of atMs - joinedMs (0 if negative). An admission
// recorded more than waitSlack before the join (a shopper back on a new
// connection after their turn) was counted when it came, or on a
// connection of another gateway: it is not counted again.
func (t *tally) waited(sale int64, now time.Time, joinedMs, atMs int64) {
	if joinedMs == 0 || atMs < joinedMs-waitSlack.Milliseconds() {
		return
	}
	ms := max(0, atMs-joinedMs)
	b := sort.Search(len(waitBoundsMs), func(i int) bool { return ms <= waitBoundsMs[i] })
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.row(sale, now)
	m.waits[b]++
	if m.waitMin < 0 || ms < m.waitMin {
		m.waitMin = ms
	}
	m.waitMax = max(m.waitMax, ms)
}

// Refused counts, for the sale's report, a join refused by rule before it
// reached the room (the gateway's address and user checks). It takes a
// lock and does no I/O.
func (r *Room) Refused(saleID int64, rule string) {
	r.tally.refused(saleID, r.cfg.Now(), rule)
}

// guardRefused counts a join the JoinGuard refused: BLOCKED is the
// blocklist's; an UNAVAILABLE (Redis could not record a proof of work) is
// not a refusal.
func (r *Room) guardRefused(saleID int64, err error) {
	var fe *flashsale.Error
	if errors.As(err, &fe) && fe.Code == flashsale.CodeBlocked {
		r.tally.refused(saleID, r.cfg.Now(), RuleBlocklist)
	}
}

// reportRow is a row of sale_report_minutes as a gateway writes it.
type reportRow struct {
	key tallyKey
	m   minuteTally
}

// dirty returns a copy of the rows changed since their last write.
func (t *tally) dirty() []reportRow {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []reportRow
	for k, m := range t.rows {
		if m.ver != m.flushed {
			c := *m
			c.refusals = maps.Clone(m.refusals)
			c.shadowed = maps.Clone(m.shadowed)
			out = append(out, reportRow{key: k, m: c})
		}
	}
	return out
}

// written marks rows as written at the version copied, and forgets the
// rows of minutes before now's that nothing changed since.
func (t *tally) written(rows []reportRow, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range rows {
		if m := t.rows[r.key]; m != nil {
			m.flushed = max(m.flushed, r.m.ver)
		}
	}
	cur := now.Unix() - now.Unix()%60
	for k, m := range t.rows {
		if k.minute < cur && m.ver == m.flushed {
			delete(t.rows, k)
		}
	}
}

// reportLoop writes the tally every Config.ReportEvery until ctx ends.
// Run writes it a last time once every other loop has stopped.
func (r *Room) reportLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.ReportEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.flushReport(ctx)
		}
	}
}

// flushReport writes the changed rows of the tally; a failure is logged
// and the rows stay dirty for the next write. With no Config.Report the
// rows are dropped as if written, so that they do not pile up.
func (r *Room) flushReport(ctx context.Context) {
	rows := r.tally.dirty()
	if len(rows) == 0 {
		return
	}
	if r.cfg.Report != nil {
		if err := r.cfg.Report.save(ctx, r.id, rows); err != nil {
			r.log.Warn("write report roll-up", "rows", len(rows), "err", err)
			return
		}
	}
	r.tally.written(rows, r.cfg.Now())
}

// PGReport is the report's roll-up in PostgreSQL (sale_report_minutes,
// migration 0013): the gateways write it, the operator API reads it.
type PGReport struct{ pool *pgxpool.Pool }

// NewPGReport returns the PostgreSQL roll-up.
func NewPGReport(pool *pgxpool.Pool) *PGReport { return &PGReport{pool: pool} }

// save upserts rows as gateway's figures so far for their minutes.
func (p *PGReport) save(ctx context.Context, gateway string, rows []reportRow) error {
	var b pgx.Batch
	for _, r := range rows {
		refusals, err := jsonCounts(r.m.refusals)
		if err != nil {
			return err
		}
		shadowed, err := jsonCounts(r.m.shadowed)
		if err != nil {
			return err
		}
		var wmin, wmax *int64
		if r.m.waitMin >= 0 {
			wmin, wmax = &r.m.waitMin, &r.m.waitMax
		}
		b.Queue(`INSERT INTO sale_report_minutes (sale_id, minute, gateway, seq, serving, prequeue, holds, refusals, shadowed, waits, wait_min_ms, wait_max_ms)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
			ON CONFLICT (sale_id, minute, gateway) DO UPDATE SET seq = EXCLUDED.seq, serving = EXCLUDED.serving,
				prequeue = EXCLUDED.prequeue, holds = EXCLUDED.holds, refusals = EXCLUDED.refusals, shadowed = EXCLUDED.shadowed,
				waits = EXCLUDED.waits, wait_min_ms = EXCLUDED.wait_min_ms, wait_max_ms = EXCLUDED.wait_max_ms, updated_at = now()`,
			r.key.sale, time.Unix(r.key.minute, 0).UTC(), gateway, r.m.seq, r.m.serving, r.m.prequeue, r.m.holds, refusals, shadowed, r.m.waits[:], wmin, wmax)
	}
	if err := p.pool.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("waitroom.save report: %w", err)
	}
	return nil
}

// jsonCounts is counts as a JSON object ({} for none).
func jsonCounts(counts map[string]int64) ([]byte, error) {
	if counts == nil {
		return []byte("{}"), nil
	}
	b, err := json.Marshal(counts)
	if err != nil {
		return nil, fmt.Errorf("waitroom.save report: %w", err)
	}
	return b, nil
}

// minuteSum is one minute summed over the gateways' rows.
type minuteSum struct {
	at                     time.Time
	seq, serving, prequeue int64
	holds                  int64
	refusals, shadowed     map[string]int64
	waits                  [waitBuckets]int64
	waitMin, waitMax       int64
}

// RoomReport reads a sale's roll-up, summed over the gateways. A sale the
// room never saw has an empty report (Joined 0, PreQueue -1, no minutes).
func (p *PGReport) RoomReport(ctx context.Context, saleID int64) (_ flashsale.RoomReport, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	rows, err := p.pool.Query(ctx, `SELECT minute, seq, serving, prequeue, holds, refusals, shadowed, waits, wait_min_ms, wait_max_ms
		FROM sale_report_minutes WHERE sale_id = $1 ORDER BY minute`, saleID)
	if err != nil {
		return flashsale.RoomReport{}, fmt.Errorf("waitroom.RoomReport: %w", err)
	}
	defer rows.Close()
	var sums []*minuteSum
	for rows.Next() {
		var (
			at                            time.Time
			seq, serving, prequeue, holds int64
			refusals, shadowed            map[string]int64
			waits                         []int64
			wmin, wmax                    *int64
		)
		if err := rows.Scan(&at, &seq, &serving, &prequeue, &holds, &refusals, &shadowed, &waits, &wmin, &wmax); err != nil {
			return flashsale.RoomReport{}, fmt.Errorf("waitroom.RoomReport: %w", err)
		}
		if len(sums) == 0 || !sums[len(sums)-1].at.Equal(at) {
			sums = append(sums, &minuteSum{at: at.UTC(), prequeue: -1, waitMin: -1, waitMax: -1, refusals: map[string]int64{}, shadowed: map[string]int64{}})
		}
		s := sums[len(sums)-1]
		s.seq, s.serving, s.prequeue = max(s.seq, seq), max(s.serving, serving), max(s.prequeue, prequeue)
		s.holds += holds
		for rule, n := range refusals {
			s.refusals[rule] += n
		}
		for rule, n := range shadowed {
			s.shadowed[rule] += n
		}
		for i, n := range waits {
			if i < waitBuckets {
				s.waits[i] += n
			}
		}
		if wmin != nil && (s.waitMin < 0 || *wmin < s.waitMin) {
			s.waitMin = *wmin
		}
		if wmax != nil {
			s.waitMax = max(s.waitMax, *wmax)
		}
	}
	if err := rows.Err(); err != nil {
		return flashsale.RoomReport{}, fmt.Errorf("waitroom.RoomReport: %w", err)
	}
	return roomReport(sums), nil
}

// roomReport turns the minutes' sums into the report: the queue's
// readings carried forward as totals (a reading never goes down), the
// counts per minute and overall, the minutes between two rows filled in.
func roomReport(sums []*minuteSum) flashsale.RoomReport {
	rep := flashsale.RoomReport{PreQueue: -1, Refusals: map[string]int64{}, Shadowed: map[string]int64{}, Minutes: []flashsale.RoomMinute{}}
	var all minuteSum
	all.waitMin, all.waitMax = -1, -1
	joined, admitted, prequeue := int64(0), int64(0), int64(-1)
	for i, s := range sums {
		if i > 0 {
			// The minutes no gateway wrote: nothing changed in them.
			for at := sums[i-1].at.Add(time.Minute); at.Before(s.at); at = at.Add(time.Minute) {
				rep.Minutes = append(rep.Minutes, flashsale.RoomMinute{At: at, Joined: joined, PreQueue: prequeue,
					Admitted: admitted, Waiting: joined - admitted, Refusals: map[string]int64{}, Shadowed: map[string]int64{}})
			}
		}
		j := max(joined, s.seq)
		// The cursor may pass places no shopper holds: admitted
		// shoppers are at most the joined ones.
		a := max(admitted, min(s.serving, j))
		prequeue = max(prequeue, s.prequeue)
		rep.Minutes = append(rep.Minutes, flashsale.RoomMinute{At: s.at, Joins: j - joined, Joined: j, PreQueue: prequeue,
			Admissions: a - admitted, Admitted: a, Holds: s.holds, Waiting: j - a, Refusals: s.refusals,
			Shadowed: orEmpty(s.shadowed), Wait: waitFigures(&s.waits, s.waitMin, s.waitMax)})
		joined, admitted = j, a
		rep.Holds += s.holds
		for rule, n := range s.refusals {
			rep.Refusals[rule] += n
		}
		for rule, n := range s.shadowed {
			rep.Shadowed[rule] += n
		}
		for b, n := range s.waits {
			all.waits[b] += n
		}
		if s.waitMin >= 0 && (all.waitMin < 0 || s.waitMin < all.waitMin) {
			all.waitMin = s.waitMin
		}
		all.waitMax = max(all.waitMax, s.waitMax)
	}
	rep.Joined, rep.Admitted, rep.PreQueue, rep.Waiting = joined, admitted, prequeue, joined-admitted
	rep.Wait = waitFigures(&all.waits, all.waitMin, all.waitMax)
	return rep
}

func orEmpty(m map[string]int64) map[string]int64 {
	if m == nil {
		return map[string]int64{}
	}
	return m
}

// waitFigures computes the percentiles of a histogram: each is the bound
// of the bucket its rank falls in, kept within [lo, hi], the shortest and
// longest wait seen (so the overflow bucket reports hi).
func waitFigures(waits *[waitBuckets]int64, lo, hi int64) flashsale.WaitFigures {
	var n int64
	for _, c := range waits {
		n += c
	}
	if n == 0 || lo < 0 {
		return flashsale.WaitFigures{}
	}
	pct := func(q int64) int64 {
		// The rank of the q-th percentile, 1-based: ceil(q*n/100).
		rank := (q*n + 99) / 100
		var seen int64
		for b, c := range waits {
			seen += c
			if seen >= rank {
				if b < len(waitBoundsMs) {
					return min(max(waitBoundsMs[b], lo), hi)
				}
				return hi
			}
		}
		return hi
	}
	return flashsale.WaitFigures{Count: n, MinMs: lo, P50Ms: pct(50), P90Ms: pct(90), P99Ms: pct(99), MaxMs: hi}
}
