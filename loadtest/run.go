package loadtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/flashsale/flashsale/auth"
)

// operatorUserID is the user id of the run's operator token.
const operatorUserID = 1

// Run executes one load run against a running stack. It returns the report
// and, when an invariant is broken, a non-nil error besides it. Other
// errors (bad config, the sale cannot be created) come with a nil report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if w := crowdedAddrWarning(cfg); w != "" && cfg.Progress != nil {
		fmt.Fprintln(cfg.Progress, w)
	}
	started := time.Now()
	// The CPU snapshots: one now, one at the opening and every
	// cpuSampleEvery through the shopper phase, one at the end.
	cpu := newCPUSampler("/proc", os.Getpid(), cfg.ServerPIDs)
	cpu.snap(started)
	parent := ctx
	ctx, cancel := context.WithDeadline(ctx, started.Add(cfg.Duration))
	defer cancel()

	bases := cfg.baseURLs()
	ctl := newHTTPClient(nil)
	defer ctl.closeIdle()
	if cfg.AdminURL != "" {
		if err := waitReady(ctx, ctl, cfg.AdminURL); err != nil {
			return nil, err
		}
	}
	opTok, err := auth.Mint(cfg.JWTSecret, operatorUserID, true, cfg.Duration+time.Hour, started)
	if err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	rec := newRecorder(started)
	adm := &admin{hc: ctl, bases: bases, tok: opTok, rec: rec}
	if cfg.ShadowShare > 0 {
		if err := adm.enableShadowQueue(ctx, cfg); err != nil {
			return nil, err
		}
	}
	var sale *adminSale
	if cfg.SaleID == 0 {
		sale, err = adm.createSale(ctx, cfg, started)
	} else {
		sale, err = adm.getSale(ctx, cfg.SaleID)
	}
	if err != nil {
		return nil, err
	}
	info := sale.info()
	if info.OpensAt.IsZero() {
		info.OpensAt = started.Add(cfg.StartsIn)
	}

	rep := &Report{
		Scenario: cfg.Scenario, Transport: cfg.Transport, SaleID: info.ID, Shoppers: cfg.Shoppers,
		Items: len(info.Items), Processes: cfg.Processes, SourceAddrs: cfg.SourceAddrs,
		StartedAt: started, OpensAt: info.OpensAt, Config: cfg, Allocation: sale.Allocation,
	}
	for _, it := range info.Items {
		rep.Quantity += it.Quantity
	}

	cpuCtx, cpuStop := context.WithCancel(ctx)
	cpuDone := make(chan struct{})
	go func() {
		defer close(cpuDone)
		cpu.run(cpuCtx, info.OpensAt)
	}()
	stopCPU := sync.OnceFunc(func() { cpuStop(); <-cpuDone })
	defer stopCPU()

	profiles := func() []string { return nil }
	if cfg.Profile.on() {
		if err := os.MkdirAll(cfg.Profile.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("loadtest: profile dir: %w", err)
		}
		notes := make(chan []string, 1)
		go func() { notes <- profileServers(ctx, cfg.Profile, info.OpensAt) }()
		self := profileOpening(ctx, cfg.Profile, "loadtest", info.OpensAt)
		profiles = sync.OnceValue(func() []string {
			n := <-notes
			if err := self(); err != nil {
				n = append(n, "opening profile of the load tool: "+err.Error())
			}
			return n
		})
		defer profiles()
	}

	cl := newClients(bases, cfg.SourceAddrs)
	defer cl.close()
	sh := newShard(cfg, info, rec, cl)
	prog := newProgress(cfg.Progress, started, rec)
	progCtx, progStop := context.WithCancel(ctx)
	progDone := make(chan struct{})
	go func() {
		defer close(progDone)
		prog.run(progCtx)
	}()
	defer func() { progStop(); <-progDone }()

	// Hostile-only phase, before opening: early clicks and half the flood
	// (all of it without shoppers), around the Redis command counter.
	preFlood := cfg.Hostile.PurchaseFlood
	if cfg.Shoppers > 0 || cfg.Hostile.OneAddrUsers > 0 {
		preFlood = cfg.Hostile.PurchaseFlood / 2
	}
	if preFlood+cfg.Hostile.EarlyClicks > 0 {
		rep.Redis = hostilePhase(ctx, cfg, sh, info.OpensAt, preFlood, rep)
	}

	// Order rows in PostgreSQL, counted from the opening to the end of
	// the quiet wait: how long reservations take to be persisted.
	var poller *orderPoller
	if cfg.DatabaseURL != "" {
		poller = startOrderPoller(ctx, cfg.DatabaseURL, info.ID, info.OpensAt, 100*time.Millisecond)
	}

	// Shopper phase: ends when every shopper is done, when paid = quantity
	// (UntilPaid), or QuietTimeout before the hard deadline.
	shopDeadline := started.Add(cfg.Duration - cfg.QuietTimeout - 2*time.Second)
	shopCtx, shopCancel := context.WithDeadline(ctx, shopDeadline)
	defer shopCancel()
	var stopMu sync.Mutex
	stopped := ""
	setStopped := func(s string) {
		stopMu.Lock()
		if stopped == "" {
			stopped = s
		}
		stopMu.Unlock()
	}
	var wg sync.WaitGroup
	if rest := cfg.Hostile.PurchaseFlood - preFlood; rest > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sleepCtx(shopCtx, time.Until(info.OpensAt)) {
				sh.hostile(shopCtx, rest, false)
			}
		}()
	}
	if n := cfg.Hostile.OneAddrUsers; n > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh.runOneAddr(shopCtx, n)
		}()
	}
	watchDone := make(chan struct{})
	if cfg.UntilPaid || cfg.KeepWaiting {
		go func() {
			defer close(watchDone)
			watchEnd(shopCtx, adm, info.ID, cfg, func(why string) { setStopped(why); shopCancel() })
		}()
	} else {
		close(watchDone)
	}
	spread := cfg.JoinSpread
	if spread == 0 {
		spread = max(time.Duration(float64(time.Until(info.OpensAt))*0.8), 200*time.Millisecond)
	}
	spec := workSpec{
		Config: cfg, JWTSecret: cfg.JWTSecret, Sale: info, Epoch: started, JoinStart: time.Now(),
		Spread: spread, Total: cfg.Shoppers, First: 0, Count: cfg.Shoppers, Deadline: shopDeadline,
	}
	var workerErr error
	if cfg.Processes > 1 && cfg.Shoppers > 0 {
		workerErr = runWorkers(shopCtx, spec, cfg.Processes, prog, rec)
	} else {
		sh.runShoppers(shopCtx, spec)
	}
	if cfg.UntilPaid || cfg.KeepWaiting {
		// The shoppers are done (or still waiting): paid = quantity, a
		// quiet sell-out or the deadline ends the phase.
		<-shopCtx.Done()
	}
	wg.Wait()
	switch {
	case !time.Now().Before(shopDeadline):
		setStopped("duration")
	case ctx.Err() != nil:
		setStopped("canceled")
	default:
		setStopped("done")
	}
	shopCancel()
	wg.Wait()
	<-watchDone
	stopCPU()
	rep.Notes = append(rep.Notes, profiles()...)
	if workerErr != nil {
		rep.Notes = append(rep.Notes, "workers: "+workerErr.Error())
	}
	rep.Stopped = stopped

	// Quiet wait, then the invariants.
	p := rec.result()
	rep.fill(p)
	if n := joinRefusalNote(cfg, rep.Steps[StepJoin]); n != "" {
		rep.Notes = append(rep.Notes, n)
	}
	figs, quiet, qd := waitQuiet(ctx, adm, info.ID, cfg.QuietTimeout)
	if figs != nil {
		rep.setFigures(figs.Items)
		rep.Queue = figs.Queue
	}
	var items []ItemFigures
	if figs != nil {
		items = figs.Items
	}
	// The ledger: every order the run learnt of, read back as its owner
	// through the API and from PostgreSQL; the final statuses replace
	// what the shoppers last saw for the checks that follow. The
	// read-back and the database checks have a budget of their own past
	// Duration (QuietTimeout, at least 5 s): a quiet wait that ran
	// to its end must not leave them without time.
	cctx, ccancel := context.WithTimeout(parent, max(cfg.QuietTimeout, 5*time.Second))
	defer ccancel()
	rep.Ledger = buildLedger(p.Orders, info.OpensAt.UnixMilli())
	rep.AllocationMs = allocationMs(rep.Ledger, info.OpensAt)
	readBackAPI(cctx, cfg, ctl, bases, rec, rep.Ledger)
	sm := &Summary{}
	var db map[string]string
	if cfg.DatabaseURL != "" {
		var err error
		if db, err = readBackDB(cctx, cfg.DatabaseURL, info.ID); err != nil {
			sm.LedgerError = err.Error()
		}
	}
	if cfg.Redis.URL != "" || len(cfg.Redis.Cluster) > 0 || len(cfg.Redis.Sentinels) > 0 {
		rep.Fairness = fairness(cctx, cfg, ctl, bases[0], info.ID, int64(rep.Quantity), rep.Ledger, sh.fastClient)
	}
	settle(rep.Ledger, db)
	applyFinal(p.Orders, rep.Ledger)
	rep.Summary = sm
	sm.tallyLedger(rep.Ledger, db != nil)
	sm.strand(figs, p.Count.WaitingAtEnd)
	sm.Reconnects, sm.GatewayMoves, sm.PlacesLost = p.Count.Reconnects, p.Count.GatewayMoves, p.Count.PlacesLost
	if items != nil {
		sm.Oversold = max(oversoldAdmin(items), oversoldRun(p.Orders, items))
	}
	if poller != nil {
		rep.Persist = poller.stop(rep.Orders.Reserved, info.OpensAt.UnixMilli(), rep.LastReservationMs)
	}
	rep.checkRun(p.Orders, items, quiet, qd)
	if cfg.ShadowShare > 0 {
		rep.checkShadow(cctx, adm, info.ID, p.Orders)
	}
	if cfg.DatabaseURL != "" {
		rep.checkPostgres(cctx, cfg.DatabaseURL, info.ID)
	} else {
		rep.Invariants = append(rep.Invariants,
			InvariantResult{Name: "one order per user (PostgreSQL)", Skipped: true, Detail: "no DatabaseURL"},
			InvariantResult{Name: "no reservation before the opening (PostgreSQL)", Skipped: true, Detail: "no DatabaseURL"},
			InvariantResult{Name: "every order told to its shopper (PostgreSQL)", Skipped: true, Detail: "no DatabaseURL"},
			InvariantResult{Name: "orders ≤ stock (PostgreSQL)", Skipped: true, Detail: "no DatabaseURL"})
	}
	// Every request of the run has been counted by now.
	sm.tallyResponses(p.Server5xx, p.NetErrors)
	rep.checkSummary()
	rep.FinishedAt = time.Now()
	cpu.snap(rep.FinishedAt)
	rep.CPU = rep.cpuReport(cpu, clockTicks())
	rep.ElapsedMs = rep.FinishedAt.Sub(started).Milliseconds()
	return rep, rep.Err()
}

// hostilePhase runs the hostile-only traffic before opening and measures
// Redis commands over an idle baseline window and over the phase.
func hostilePhase(ctx context.Context, cfg Config, sh *shard, opensAt time.Time, flood int, rep *Report) *RedisReport {
	budget := time.Until(opensAt) - 200*time.Millisecond
	if budget < time.Second {
		// Already open (or about to): the phase still runs, bounded.
		budget = 10 * time.Second
		rep.Notes = append(rep.Notes, "hostile phase ran after opening: early clicks are plain clicks without admission")
	}
	var rr *RedisReport
	var rc *redisCounter
	if cfg.Redis.Set() {
		var err error
		rc, err = newRedisCounter(cfg.Redis)
		if err != nil {
			return &RedisReport{Error: err.Error()}
		}
		defer rc.close()
		rr = &RedisReport{}
		base := min(budget/4, time.Second)
		budget -= base
		b0, err := rc.total(ctx)
		if err == nil {
			t0 := time.Now()
			sleepCtx(ctx, base)
			var b1 int64
			b1, err = rc.total(ctx)
			rr.BaselineMs, rr.BaselineCommands = time.Since(t0).Milliseconds(), b1-b0
		}
		if err != nil {
			rr.Error = err.Error()
			rc.close()
			rc = nil
		}
	}
	pctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	var before int64
	if rc != nil {
		before, _ = rc.total(ctx)
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	var sentEarly, sentFlood int64
	wg.Add(2)
	go func() { defer wg.Done(); sentEarly = sh.hostile(pctx, cfg.Hostile.EarlyClicks, true) }()
	go func() { defer wg.Done(); sentFlood = sh.hostile(pctx, flood, false) }()
	wg.Wait()
	if rc != nil {
		after, err := rc.total(ctx)
		rr.Before, rr.After = before, after
		rr.HostileMs = time.Since(t0).Milliseconds()
		rr.HostileCommands = after - before
		rr.HostileRequests = sentEarly + sentFlood
		if err != nil {
			rr.Error = err.Error()
		}
		rr.computeExcess()
	}
	return rr
}

// watchEnd polls the admin API every second and calls done with the
// reason the shopper phase ends: "paid" once paid = quantity for every
// item (UntilPaid), "quiet" once every item was sold out with nothing on
// its way back on every read for SoldOutQuiet (KeepWaiting).
func watchEnd(ctx context.Context, adm *admin, saleID int64, cfg Config, done func(why string)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var quietSince time.Time // zero: not sold out and quiet on the last read
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s, err := adm.getSale(ctx, saleID)
		if err != nil || len(s.Items) == 0 {
			quietSince = time.Time{}
			continue
		}
		paid, soldOut := true, conserved(s.Items)
		for _, it := range s.Items {
			paid = paid && it.Paid >= it.Quantity
			soldOut = soldOut && it.Remaining == 0
		}
		switch {
		case cfg.UntilPaid && paid:
			done("paid")
			return
		case !cfg.KeepWaiting || !soldOut:
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) >= cfg.SoldOutQuiet:
			done("quiet")
			return
		}
	}
}

// waitQuiet reads the admin figures until remaining + sold = quantity for
// every item on two reads in a row, or timeout. It returns the last figures
// read (nil if none could be read), whether they were quiet, and why not.
func waitQuiet(ctx context.Context, adm *admin, saleID int64, timeout time.Duration) (*adminSale, bool, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last *adminSale
	var lastErr error
	streak := 0
	for {
		s, err := adm.getSale(ctx, saleID)
		switch {
		case err != nil:
			lastErr = err
			streak = 0
		default:
			last = s
			if conserved(s.Items) {
				streak++
			} else {
				streak = 0
			}
		}
		if streak >= 2 {
			return last, true, ""
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			why := fmt.Sprintf("not quiet within %s", timeout)
			if last == nil && lastErr != nil {
				why += ": " + lastErr.Error()
			}
			return last, false, why
		}
	}
}

func conserved(items []ItemFigures) bool {
	for _, it := range items {
		if it.Remaining+it.Sold != it.Quantity {
			return false
		}
	}
	return len(items) > 0
}
