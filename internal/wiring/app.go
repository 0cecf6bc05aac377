package wiring

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/admission"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/defense"
	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/adapter/prom"
	"github.com/flashsale/flashsale/internal/adapter/redisclock"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/purchase"
	"github.com/flashsale/flashsale/sales"
)

// Roles selects what a process runs.
type Roles struct {
	Gateway bool // HTTP API, waiting room, purchase, reconciler
	Writer  bool // Kafka → PostgreSQL
	Expiry  bool // payment expiry + stock-return outbox
}

// AllRoles is what `flashsale dev` runs.
var AllRoles = Roles{Gateway: true, Writer: true, Expiry: true}

// redisMinIdle is how many Redis connections a process opens at start and
// keeps idle (of its pool of 256).
const redisMinIdle = 64

// sentinelReplicaWait bounds how long a reservation waits for a replica's
// acknowledgement behind Sentinel; it stays well inside the purchase's
// Redis timeout.
const sentinelReplicaWait = 500 * time.Millisecond

// App is a running set of roles.
type App struct {
	// PublicURL and AdminURL are http://host:port of the listeners
	// (with the real port when the configured one was :0).
	PublicURL string
	AdminURL  string
	// KafkaBrokers are the brokers in use (the embedded ones in dev).
	KafkaBrokers []string

	cfg    Config
	log    *slog.Logger
	reg    *prometheus.Registry
	rdb    redis.UniversalClient
	clock  *redisclock.Clock // the fleet's clock for every sale time
	pool   *pgxpool.Pool
	broker *Broker // the embedded one, when no brokers are configured
	kping  *kafkaPinger

	guard    *defense.Guard // gateway role only
	settings *defense.Store
	stock    *redisstock.Store
	sales    *sales.Store
	cache    *sales.Cache
	access   *auth.Cache
	jwks     *auth.JWKS // nil without FLASHSALE_JWT_JWKS_URL
	signer   *admission.Signer

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	errMu     sync.Mutex
	err       error
	shutdowns []func(context.Context) error // listeners: run first on Close
	closers   []func(context.Context) error // resources: run in reverse, last
	done      chan struct{}
	stopOnce  sync.Once
	draining  atomic.Bool // /readyz answers 503 (Drain)
	depUp     *prometheus.GaugeVec
}

// Start connects the dependencies and starts the selected roles. The roles
// run until ctx ends or Close is called; Wait returns the first role error.
func Start(ctx context.Context, cfg Config, roles Roles, logger *slog.Logger) (_ *App, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a := &App{cfg: cfg, log: logger, reg: prometheus.NewRegistry(), cancel: cancel, done: make(chan struct{})}
	defer func() {
		if err != nil {
			a.Close(context.Background())
		}
	}()
	if _, err := prom.Register(a.reg, collectors.NewGoCollector()); err != nil {
		return nil, err
	}
	if _, err := prom.Register(a.reg, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, err
	}
	if _, err := prom.Register(a.reg, buildInfo()); err != nil {
		return nil, err
	}

	rcfg := cfg.Redis()
	// Per node. Connections opened at start (a min_idle_conns in the URL
	// wins): at a sale's opening every purchase wants one at once, and
	// opening them then (dial, HELLO, buffers) takes CPU from the purchases
	// when the machine is busiest.
	rcfg.PoolSize, rcfg.MinIdleConns = 256, redisMinIdle
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	if a.rdb, err = redisconn.Open(pctx, rcfg); err != nil {
		return nil, err
	}
	a.onClose(func(context.Context) error { return a.rdb.Close() })
	if err := a.startClock(ctx, runCtx); err != nil {
		return nil, err
	}
	a.pool, err = postgres.Open(ctx, postgres.Config{URL: cfg.DatabaseURL, MaxConns: cfg.DBMaxConns, MinConns: cfg.DBMinConns})
	if err != nil {
		return nil, err
	}
	a.onClose(func(context.Context) error { a.pool.Close(); return nil })
	if err := postgres.CheckSchema(ctx, a.pool); err != nil {
		return nil, fmt.Errorf("%w (run `flashsale migrate`)", err)
	}
	if len(cfg.KafkaBrokers) == 0 {
		a.broker, err = StartBroker(BrokerConfig{Port: cfg.KafkaPort, DataDir: cfg.KafkaDataDir}, logger)
		if err != nil {
			return nil, err
		}
		a.KafkaBrokers = a.broker.Addrs()
		a.onClose(func(context.Context) error { a.broker.Close(); return nil })
	} else {
		a.KafkaBrokers = cfg.KafkaBrokers
	}

	a.kping, err = newKafkaPinger(a.KafkaBrokers, cfg.KafkaSecurity, logger)
	if err != nil {
		return nil, err
	}
	a.onClose(func(context.Context) error { a.kping.Close(); return nil })
	if len(cfg.KafkaBrokers) > 0 {
		// A broker that refuses the TLS handshake or the credentials is a
		// configuration error: it fails the start with the broker's
		// reason, not a gateway answering 503 for ever.
		kctx, kcancel := context.WithTimeout(ctx, 10*time.Second)
		defer kcancel()
		if err := a.kping.Ping(kctx); err != nil {
			hint := ""
			if errors.Is(err, io.EOF) && cfg.KafkaSecurity.SASLMechanism != "" {
				hint = " (a broker that closes the connection during SASL authentication has usually refused the mechanism, username or password)"
			}
			return nil, fmt.Errorf("kafka at %v (%v): %w%s", a.KafkaBrokers, cfg.KafkaSecurity, err, hint)
		}
		if err := ensureTopics(kctx, a.KafkaBrokers, cfg, logger); err != nil {
			return nil, err
		}
	}

	a.stock = redisstock.New(a.rdb)
	if len(cfg.RedisSentinels) > 0 {
		// A master Sentinel may replace: a reservation counts once a
		// replica holds it, so a promotion never loses an acknowledged
		// unit (redisstock.RequireReplicas); a purchase answers 503 while
		// no replica is attached.
		a.stock.RequireReplicas(1, sentinelReplicaWait)
	}
	if err := a.stock.LoadScripts(ctx); err != nil {
		return nil, err
	}
	a.sales = sales.NewStore(a.pool, a.rdb, a.stock, a.clock.Now)
	a.cache = sales.NewCache(a.sales, a.rdb, time.Second, logger)
	if err := a.cache.Refresh(ctx); err != nil {
		return nil, err
	}
	a.goRun("sales-cache", func() error { return a.cache.Run(runCtx) })
	// Every process keeps the placement leases' clock going, so that it
	// stops only when Redis does (redisstock.RunLeaseClock).
	a.goRun("lease-clock", func() error { return a.stock.RunLeaseClock(runCtx, purchase.DefaultLeaseTTL) })

	var keyOpts []auth.Option
	for _, f := range cfg.JWTPublicKeys {
		k, err := loadPublicKey(f)
		if err != nil {
			return nil, err
		}
		keyOpts = append(keyOpts, auth.WithPublicKey(k))
	}
	if cfg.JWTJWKSURL != "" {
		// The key set is fetched now and refreshed until the app stops; a
		// provider down at start does not stop it (its tokens answer 401
		// and /readyz 503 until the keys load).
		a.jwks, err = auth.NewJWKS(runCtx, auth.JWKSConfig{URL: cfg.JWTJWKSURL}, logger)
		if err != nil {
			return nil, fmt.Errorf("FLASHSALE_JWT_JWKS_URL: %w", err)
		}
		keyOpts = append(keyOpts, auth.WithJWKS(a.jwks))
	}
	if cfg.JWTIssuer != "" {
		keyOpts = append(keyOpts, auth.WithIssuer(cfg.JWTIssuer))
	}
	if cfg.JWTAudience != "" {
		keyOpts = append(keyOpts, auth.WithAudience(cfg.JWTAudience))
	}
	keyOpts = append(keyOpts, auth.WithMaxLifetime(cfg.JWTMaxLifetime))
	tiers, err := auth.ParseTierSigners(cfg.JWTTierSigners)
	if err != nil {
		return nil, fmt.Errorf("FLASHSALE_JWT_TIER_SIGNERS: %w", err)
	}
	keyOpts = append(keyOpts, auth.WithTierSigners(tiers))
	a.access = auth.NewCache(auth.NewVerifier(cfg.JWTSecret, keyOpts...), cfg.TokenCacheSize)
	a.signer, err = admission.NewSigner(admission.Key{ID: 1, Secret: cfg.AdmissionSecret()})
	if err != nil {
		return nil, err
	}

	if err := a.startDependencyProbe(runCtx); err != nil {
		return nil, err
	}
	admin, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	a.AdminURL = "http://" + admin.Addr().String()

	if roles.Gateway {
		if err := a.startGateway(ctx, runCtx, admin); err != nil {
			return nil, err
		}
	} else {
		a.startAdminOnly(runCtx, admin)
	}
	if roles.Writer {
		if err := a.startWriter(ctx, runCtx); err != nil {
			return nil, err
		}
	}
	if roles.Expiry {
		if err := a.startExpiry(ctx, runCtx); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func (a *App) onClose(f func(context.Context) error) { a.closers = append(a.closers, f) }

func (a *App) onShutdown(f func(context.Context) error) { a.shutdowns = append(a.shutdowns, f) }

// goRun runs a long-running part; its error (other than at shutdown) stops
// the whole app.
func (a *App) goRun(name string, f func() error) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := f(); err != nil && !errors.Is(err, context.Canceled) {
			a.log.Error("component stopped", "component", name, "err", err)
			a.errMu.Lock()
			if a.err == nil {
				a.err = fmt.Errorf("%s: %w", name, err)
			}
			a.errMu.Unlock()
			a.stop()
		}
	}()
}

func (a *App) stop() {
	a.stopOnce.Do(func() { close(a.done) })
}

// Done is closed when a component failed.
func (a *App) Done() <-chan struct{} { return a.done }

// Err is the first component error.
func (a *App) Err() error {
	a.errMu.Lock()
	defer a.errMu.Unlock()
	return a.err
}

// Ready reports whether Redis, PostgreSQL and Kafka are reachable, the
// schema is current and, with a JWKS URL, the identity provider's keys are
// loaded (for /readyz).
func (a *App) Ready(ctx context.Context) error {
	if a.draining.Load() {
		return errDraining
	}
	if err := a.probe(ctx); err != nil {
		return err
	}
	if a.jwks != nil {
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		if err := a.jwks.Ready(ctx); err != nil {
			return err
		}
	}
	switch err := a.clock.Check(); {
	case errors.Is(err, redisclock.ErrNotMeasured):
		// The process's own clock could open a sale early.
		return err
	case err != nil:
		// Ready: the offset corrects the clock; the operator hears of it.
		return gateway.ReadyNote(err.Error())
	}
	return nil
}

// startClock measures the fleet clock's offset (Redis TIME) once before
// any role starts, so that no sale time is read off this machine's own
// clock, and keeps it measured. A first measurement that fails leaves
// /readyz at 503 until one succeeds.
func (a *App) startClock(ctx, runCtx context.Context) error {
	a.clock = redisclock.New(redisclock.Config{Skew: a.cfg.ClockSkew, MaxOffset: a.cfg.ClockMaxOffset, Fleet: a.cfg.Clock}, a.rdb, a.log)
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.clock.Measure(mctx); err != nil {
		a.log.Warn("clock offset not measured at start; sale times read this machine's clock until it is", "err", err)
	} else if err := a.clock.Check(); err != nil {
		a.log.Warn("clock off the fleet's", "err", err)
	}
	if _, err := prom.Register(a.reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flashsale_clock_offset_seconds",
		Help: "The fleet clock (Redis TIME) minus this process's own clock, as last measured; sale times follow the fleet clock (FLASHSALE_CLOCK_MAX_OFFSET bounds what /readyz lets pass without a note).",
	}, func() float64 { return a.clock.Offset().Seconds() })); err != nil {
		return err
	}
	a.goRun("clock", func() error { return a.clock.Run(runCtx) })
	return nil
}

var errDraining = errors.New("draining: shutting down")

// Drain turns /readyz to 503 at once and, in a process with the gateway
// role, waits the configured drain period (or until ctx ends) while the
// listeners keep serving, so that a load balancer stops sending before
// Close closes them. Other roles take no traffic from a balancer.
func (a *App) Drain(ctx context.Context) {
	a.draining.Store(true)
	if a.cfg.DrainPeriod <= 0 || a.PublicURL == "" {
		return
	}
	a.log.Info("draining: /readyz answers 503 while the listeners keep serving", "period", a.cfg.DrainPeriod)
	t := time.NewTimer(a.cfg.DrainPeriod)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Close shuts everything down gracefully within ctx: listeners stop
// accepting, WebSockets are closed with "going away", the producer flushes,
// the writer finishes its batch and commits, pools close.
func (a *App) Close(ctx context.Context) error {
	a.stop()
	var errs []error
	for _, f := range a.shutdowns {
		if err := f(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	a.cancel() // background loops end; the writer commits its last batch
	a.wg.Wait()
	for i := len(a.closers) - 1; i >= 0; i-- {
		if err := a.closers[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Registry is the app's metrics registry.
func (a *App) Registry() *prometheus.Registry { return a.reg }

func loadPublicKey(path string) (crypto.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("public key %s: no PEM block", path)
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("public key %s: %w", path, err)
	}
	return k, nil
}

// CreateSale validates and creates a sale as POST /api/admin/sales does:
// for the demo, tools and tests.
func (a *App) CreateSale(ctx context.Context, s flashsale.Sale) (flashsale.Sale, error) {
	if err := s.Validate(); err != nil {
		return flashsale.Sale{}, fmt.Errorf("wiring.CreateSale: %w", err)
	}
	out, err := a.sales.Create(ctx, s)
	if err != nil {
		return out, err
	}
	return out, a.cache.Refresh(ctx)
}

// SetDefense stores bot-defense settings (as PUT /api/admin/settings does)
// and applies them to this process's guard at once, for tests and tools
// that must not wait for the propagation tick.
func (a *App) SetDefense(ctx context.Context, actor string, body []byte) error {
	if a.settings == nil {
		return errors.New("wiring.SetDefense: no gateway role")
	}
	st, err := defense.ParseSettings(body)
	if err != nil {
		return err
	}
	st, err = a.settings.Put(ctx, actor, st)
	if err != nil {
		return err
	}
	a.guard.Apply(st)
	return nil
}

// SignAdmission signs an admission token as the waiting room does at a
// shopper's turn (for tests and tools that drive the purchase path
// directly).
func (a *App) SignAdmission(userID, saleID int64, ttl time.Duration) string {
	return a.signer.Sign(flashsale.Admission{UserID: userID, SaleID: saleID, ExpiresAt: a.clock.Now().Add(ttl)})
}
