package wiring

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/access"
	"github.com/flashsale/flashsale/defense"
	"github.com/flashsale/flashsale/events"
	"github.com/flashsale/flashsale/expiry"
	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/orders"
	"github.com/flashsale/flashsale/purchase"
	"github.com/flashsale/flashsale/push"
	"github.com/flashsale/flashsale/reconcile"
	"github.com/flashsale/flashsale/static"
	"github.com/flashsale/flashsale/waitroom"
	"github.com/flashsale/flashsale/writer"
)

func (a *App) startGateway(ctx, runCtx context.Context, admin net.Listener) error {
	cfg := a.cfg
	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: a.KafkaBrokers, Security: cfg.KafkaSecurity, Producers: cfg.KafkaProducers}, a.log)
	if err != nil {
		return err
	}
	a.onClose(func(context.Context) error { producer.Close(); return nil })
	// Connect to the brokers and load the producer ID now, not at the first
	// purchase: under a crowd the first dial may find no file descriptor,
	// and an InitProducerID that times out fails every record behind it.
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	if err := producer.Prepare(wctx); err != nil {
		a.log.Warn("Kafka not reachable yet; purchases answer 503 until it is", "err", err)
	}
	wcancel()

	// The placement lease: a gateway that dies or freezes has its
	// reservations in flight settled once it lapses (reconcile/reclaim.go).
	lease := purchase.NewLeaser(a.stock, purchase.DefaultLeaseTTL, a.log, a.reg)
	a.goRun("lease", func() error { return lease.Run(runCtx) })
	buy := purchase.New(purchase.Config{Now: a.clock.Now, Lease: lease}, a.stock, producer, a.log, a.reg)
	a.goRun("purchase", func() error { return buy.Run(runCtx) })
	// Concurrent reservations share Redis round trips (internal/adapter/redisstock).
	a.goRun("reserve-pipeline", func() error { return a.stock.RunPipeline(runCtx, 0) })
	// The reconciler asks Kafka whether a stale reservation's record is
	// there, and never declares lost one that is.
	orderLog, err := kafka.NewOrderLog(kafka.OrderLogConfig{Brokers: a.KafkaBrokers, Security: cfg.KafkaSecurity}, a.log)
	if err != nil {
		return err
	}
	a.onClose(func(context.Context) error { orderLog.Close(); return nil })
	rec := reconcile.New(reconcile.Config{After: cfg.ReconcileAfter, PaymentWindow: cfg.PaymentWindow, Orders: orderLog,
		LeaseTTL: lease.TTL(), Now: a.clock.Now},
		a.pool, a.stock, a.cache, a.log, a.reg)
	a.goRun("reconciler", func() error { return rec.Run(runCtx) })

	ord := orders.New(orders.Config{PaymentWindow: cfg.PaymentWindow, Now: a.clock.Now}, a.pool, a.stock, a.cache, a.log)

	settings := defense.NewStore(a.pool, a.rdb, a.log)
	// The guard shares its rate-limit spend and its counters with the
	// other gateways through Redis (defense/fleet.go).
	guard := defense.NewGuard(defense.GuardConfig{TrustedProxies: cfg.TrustedProxies, PowKey: cfg.PowSecret(),
		ShareInterval: cfg.DefenseShareInterval, GatewayID: cfg.GatewayID},
		a.rdb, a.log, a.reg)
	a.goRun("defense", func() error { return guard.Run(runCtx, settings) })
	a.guard, a.settings = guard, settings

	// The gateway counts its purchase and order requests; the room's
	// status pacing yields to them.
	saleRequests := new(atomic.Int64)
	// Turn notifications: the sale's leader tells the sender whom it
	// admitted; one goroutine sends (push).
	var notify waitroom.Notifier
	var pushes gateway.Push
	if cfg.PushPublicKey != "" {
		store := push.NewStore(a.rdb)
		insecure := push.ParseHosts(cfg.PushInsecureHosts)
		sender := push.New(push.Config{PublicKey: cfg.PushPublicKey, PrivateKey: cfg.PushPrivateKey, Subject: cfg.PushSubject,
			Insecure: insecure}, store, a.log, a.reg)
		a.goRun("push", func() error { return sender.Run(runCtx) })
		notify = sender
		pushes = pushAdapter{store: store, sender: sender, insecure: insecure, keyTTL: cfg.QueueKeyTTL}
	}
	// The shop's webhook gets the same turns (shopper.admitted): the
	// leader queues them, one goroutine writes them to the outbox the
	// expiry role's deliverer drains. No webhook, no writer.
	var turns waitroom.TurnLog
	if cfg.WebhookURL != "" {
		shoppers := events.NewShoppers(events.ShopperConfig{}, a.pool, a.log, a.reg)
		a.goRun("events-shoppers", func() error { return shoppers.Run(runCtx) })
		turns = shoppers
	}
	roomReport := waitroom.NewPGReport(a.pool)
	invites := access.NewStore(a.pool, a.sales)
	room := waitroom.New(waitroom.Config{
		// Who may join a sale (its access rule).
		Gate:           access.NewGate(invites),
		Notify:         notify,
		Turns:          turns,
		Competing:      saleRequests.Load,
		AdmissionTTL:   cfg.AdmissionTTL,
		Holds:          waitroom.StockHolds{Stock: a.stock},
		CapacityFactor: cfg.CapacityFactor,
		DrawLead:       cfg.DrawLead,
		OpeningHold:    cfg.OpeningHold,
		MaxConns:       maxWebSockets(),
		MaxConnsPerIP:  cfg.WSMaxConnsPerAddr,
		OriginPatterns: originPatterns(cfg.CORSOrigins),
		AdmittedGrace:  cfg.AdmittedGrace,
		// Every sale time (the pre-queue's close, the draw, the opening,
		// serverTimeMs) is the fleet's, whatever this machine's clock says.
		Now: a.clock.Now,
		// The queue's tickets, draw and cursor outlive a Redis loss.
		Durable: waitroom.NewPGDurable(a.pool),
		// The public draw record is built once, at the draw, and stored.
		Records: waitroom.NewPGDraws(a.pool),
		// What the room saw of each sale, per minute, for the report.
		Report:      roomReport,
		DrawKey:     cfg.DrawSecret(),
		QueueKeyTTL: queueKeyTTL(cfg.QueueKeyTTL),
	}, a.rdb, a.cache, a.stock, a.access, a.signer, guard, a.log, a.reg)
	a.goRun("waitroom", func() error { return room.Run(runCtx) })

	// The stock gauge is the gateways': the processes that sell.
	if err := a.registerStockGauge(); err != nil {
		return err
	}
	site, err := static.New()
	if err != nil {
		return err
	}
	var payments gateway.ShopPayments // nil: the callback route answers 403
	if cfg.PaymentSecret != "" {
		payments = orders.NewPayments([]byte(cfg.PaymentSecret), ord)
	}
	srv := gateway.New(gateway.Config{CORSOrigins: cfg.CORSOrigins, Ready: a.Ready, SaleRequests: saleRequests,
		PaymentURL: cfg.PaymentURL, DrawLead: cfg.DrawLead,
		MaxPendingPerAddr: cfg.MaxPendingConnsPerAddr, TrustedProxies: cfg.TrustedProxies,
		DrawIdentityMax: int64(cfg.DrawIdentityMax), Correction: a.clock.Correction}, gateway.Deps{
		Access:    a.access,
		Admission: a.signer,
		Sales:     a.cache,
		Stock:     a.stock,
		SaleAdmin: saleAdmin{Store: a.sales, cache: a.cache},
		Purchase:  buy,
		Orders:    ord,
		Queue:     queueAdapter{room},
		Draws:     drawAdapter{room},
		Reports:   reportAdapter{roomReport, a.sales},
		Guard:     guard,
		Settings:  settings.JSON(),
		Static:    staticAdapter{site},
		Payments:  payments,
		Push:      pushes,
		Invites:   accessAdmin{invites, a.cache},
		Metrics:   a.reg,
		Logger:    a.log,
	})
	pub, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("public listener: %w", err)
	}
	a.PublicURL = "http://" + pub.Addr().String()
	a.goRun("http", func() error { return ignoreClosed(srv.Serve(pub)) })
	a.goRun("admin", func() error { return ignoreClosed(srv.ServeAdmin(admin)) })
	a.onShutdown(func(ctx context.Context) error {
		rerr := room.Shutdown(ctx)
		return errors.Join(rerr, srv.Shutdown(ctx))
	})
	a.log.Info("gateway listening", "public", a.PublicURL, "admin", a.AdminURL)
	return nil
}

// startAdminOnly serves /metrics, /healthz, /readyz and pprof for processes
// without the gateway role.
func (a *App) startAdminOnly(runCtx context.Context, admin net.Listener) {
	srv := &http.Server{Handler: gateway.AdminHandler(a.reg, a.Ready), ReadHeaderTimeout: 5 * time.Second}
	a.goRun("admin", func() error { return ignoreClosed(srv.Serve(admin)) })
	a.onShutdown(srv.Shutdown)
}

func (a *App) startWriter(ctx, runCtx context.Context) error {
	pool, err := postgres.Open(ctx, postgres.Config{URL: a.cfg.DatabaseURL, MaxConns: a.cfg.WriterMaxConns, MinConns: a.cfg.WriterMaxConns})
	if err != nil {
		return err
	}
	a.onClose(func(context.Context) error { pool.Close(); return nil })
	w, err := writer.New(writer.Config{
		Brokers:        a.KafkaBrokers,
		Security:       a.cfg.KafkaSecurity,
		BatchSize:      a.cfg.WriterBatchSize,
		InFlight:       a.cfg.WriterInFlight,
		MaxConns:       a.cfg.WriterMaxConns,
		PaymentWindow:  a.cfg.PaymentWindow,
		SessionTimeout: a.cfg.KafkaSessionTimeout,
		InstanceID:     a.cfg.WriterInstanceID,
	}, pool, a.stock, a.log, a.reg)
	if err != nil {
		return err
	}
	a.onClose(func(context.Context) error { return w.Close() })
	a.goRun("writer", func() error { return w.Run(runCtx) })
	return nil
}

func (a *App) startExpiry(_, runCtx context.Context) error {
	ord := orders.New(orders.Config{PaymentWindow: a.cfg.PaymentWindow, Now: a.clock.Now}, a.pool, a.stock, a.cache, a.log)
	w := expiry.New(expiry.Config{Interval: a.cfg.ExpiryInterval, Now: a.clock.Now}, a.pool, a.stock, ord, a.sales, a.log, a.reg)
	a.goRun("expiry", func() error { return w.Run(runCtx) })
	// The order-event relay runs beside the expiry worker: one of the
	// expiry processes publishes at a time, the others stand by.
	relay, err := events.NewRelay(events.RelayConfig{
		Brokers: a.KafkaBrokers, Security: a.cfg.KafkaSecurity,
		WebhookOff: a.cfg.WebhookURL == "",
	}, a.pool, a.log, a.reg)
	if err != nil {
		return err
	}
	a.goRun("events-relay", func() error { return relay.Run(runCtx) })
	if a.cfg.WebhookURL != "" {
		hook, err := events.NewDeliverer(events.WebhookConfig{
			URL: a.cfg.WebhookURL, Secret: []byte(a.cfg.WebhookSecret), MaxAttempts: a.cfg.WebhookMaxAttempts,
		}, a.pool, a.log, a.reg)
		if err != nil {
			return err
		}
		a.goRun("events-webhook", func() error { return hook.Run(runCtx) })
	}
	return nil
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// originPatterns turns CORS origins (https://cdn.example.com) into the host
// patterns coder/websocket expects (cdn.example.com).
func originPatterns(origins []string) []string {
	var out []string
	for _, o := range origins {
		if u, ok := cutScheme(o); ok {
			out = append(out, u)
		} else {
			out = append(out, o)
		}
	}
	return out
}

func cutScheme(o string) (string, bool) {
	for _, p := range []string{"https://", "http://"} {
		if len(o) > len(p) && o[:len(p)] == p {
			return o[len(p):], true
		}
	}
	return "", false
}
