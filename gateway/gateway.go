// Package gateway is the HTTP edge of flashsale: every public and operator
// route of the contract, served by fiber, with WebSocket upgrades of the
// waiting room answered on the same port by serveUpgrade (net/http's
// handler types, no net/http server). The public port's connections are
// routed by internal/conn/split and their timeouts enforced by
// internal/conn/watchdog; what a first head may not be (its framing) and
// what a fiber connection records (reqLines) stay here.
//
// Of the other components the gateway imports only defense, whose Counter
// and route classes its Guard interface speaks. It declares the small
// interfaces it calls (AccessVerifier, AdmissionVerifier, Sales, SaleAdmin,
// Purchaser, Orders, Queue, Draws, Reports, Guard, SettingsStore,
// StaticFiles, ShopPayments, Push) and
// internal/wiring wires the concrete types in. It is the only package that
// imports fiber; no fiber type leaves it except through App, for tests and
// benchmarks. TestLayout (layout_test.go) keeps these rules.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/defense"
	"github.com/flashsale/flashsale/internal/conn/split"
	"github.com/flashsale/flashsale/internal/conn/watchdog"
)

// AccessVerifier checks access tokens (*auth.Cache). The token is passed
// without its "Bearer " prefix; now is the request's time (the gateway
// reads the clock once per request).
type AccessVerifier interface {
	VerifyAt(token string, now time.Time) (flashsale.Principal, error)
}

// AdmissionVerifier checks admission tokens (admission.Signer).
type AdmissionVerifier interface {
	Verify(token string, userID, saleID int64, now time.Time) (flashsale.Admission, error)
}

// Sales is the in-memory sale cache every gateway keeps. Sale and ItemSale
// must not block: they run on the purchase path. The returned *Sale is shared
// and must not be modified.
type Sales interface {
	Sale(id int64) (*flashsale.Sale, bool)
	ItemSale(itemID int64) (*flashsale.Sale, flashsale.Item, bool)
}

// Stock reads a sale's remaining stock per item id (Redis). The gateway
// calls it at most about once per second per sale, for the public sale page.
type Stock interface {
	Remaining(ctx context.Context, saleID int64) (map[int64]int64, error)
}

// SaleAdmin is the sale store behind the operator API.
type SaleAdmin interface {
	Create(ctx context.Context, s flashsale.Sale) (flashsale.Sale, error)
	Get(ctx context.Context, id int64) (flashsale.Sale, error)
	List(ctx context.Context) ([]flashsale.Sale, error)
	Update(ctx context.Context, id int64, u flashsale.SaleUpdate) (flashsale.Sale, error)
	Figures(ctx context.Context, saleID int64) ([]flashsale.ItemFigures, error)
	// Act applies an operator's control (pause, resume, end, stock,
	// message); VERSION_CONFLICT when a.IfVersion is set and stale.
	Act(ctx context.Context, id int64, a flashsale.SaleAction) (flashsale.Sale, error)
}

// Purchaser reserves stock. SoldOut is a local flag read on every purchase
// request and must not block. Claim buys the unit held for the shopper in
// a sale allocated in queue order.
type Purchaser interface {
	SoldOut(itemID int64) bool
	Reserve(ctx context.Context, sale *flashsale.Sale, item flashsale.Item, userID int64) (orderID string, err error)
	Claim(ctx context.Context, sale *flashsale.Sale, item flashsale.Item, userID int64) (orderID string, err error)
}

// Orders reads and changes a user's orders. Unknown or foreign orders are
// NOT_FOUND.
type Orders interface {
	Get(ctx context.Context, userID int64, orderID string) (flashsale.Order, error)
	BySale(ctx context.Context, userID, saleID int64) (flashsale.Order, error)
	Pay(ctx context.Context, userID int64, orderID string) (flashsale.Order, error)
	Cancel(ctx context.Context, userID int64, orderID string) (flashsale.Order, error)
}

// Queue is the waiting room. ServeHTTP receives the WebSocket upgrades of
// GET /api/flash-sales/sales/{saleId}/queue (serveUpgrade, with
// r.RemoteAddr already rewritten to the client address the Guard resolved).
// Join and Status serve the polling fallback; their results are JSON-encoded
// as they are.
type Queue interface {
	http.Handler
	// Join's code is the invitation code the shopper gave ("" none).
	Join(ctx context.Context, p flashsale.Principal, saleID int64, ip netip.Addr, pow json.RawMessage, code string) (any, error)
	Status(ctx context.Context, p flashsale.Principal, saleID int64) (any, error)
	// Choose records the caller's choice of item for their turn (a sale
	// allocated in queue order): NOT_FOUND, INVALID, CHOICE_CLOSED.
	Choose(ctx context.Context, p flashsale.Principal, saleID, itemID int64) error
	Figures(ctx context.Context, saleID int64) (flashsale.QueueFigures, error)
	// Refused counts, for the sale's report, a join the gateway's guard
	// refused before the room saw it, by rule. It must not block.
	Refused(saleID int64, rule string)
	// ShadowList is the sale's shadow queue for the console: counts by
	// rule and up to limit shoppers. ReleaseShadowed takes a shopper out
	// of it (NOT_FOUND if not in it).
	ShadowList(ctx context.Context, saleID int64, limit int) (any, error)
	ReleaseShadowed(ctx context.Context, saleID, userID int64) error
}

// Reports are the two halves of a sale's report (GET
// /api/admin/sales/{saleId}/report): what the waiting room saw, from the
// gateways' roll-up, and the orders' figures. Both read PostgreSQL.
type Reports interface {
	RoomReport(ctx context.Context, saleID int64) (flashsale.RoomReport, error)
	OrderReport(ctx context.Context, saleID int64) (flashsale.OrderReport, error)
}

// Draws serves the public record of a sale's pre-queue draw, built once
// at the draw and stored (waitroom.Room.PublishedDraw). PublishedDraw
// returns the stored record, without the body when it is longer than
// maxBody bytes, or NOT_DRAWN until it is stored; it must not build one.
// The gateway keeps records in memory, since one never changes.
type Draws interface {
	PublishedDraw(ctx context.Context, saleID, maxBody int64) (DrawRecord, error)
}

// DrawRecord is a stored draw record: the JSON body (nil: not asked for),
// its gzip form and the body's quoted strong ETag.
type DrawRecord struct {
	Body []byte
	Gzip []byte
	ETag string
}

// Guard is the bot defense (*defense.Guard satisfies it). Check methods
// return a RATE_LIMITED or BLOCKED domain error to refuse, with how long to
// wait for RATE_LIMITED. They must not block.
type Guard interface {
	// ClientAddr resolves the client behind trusted proxies; xff is every
	// X-Forwarded-For header of the request joined with ",".
	ClientAddr(peer netip.Addr, xff string) netip.Addr
	// CheckAddrAt and CheckUserAt take the request's time now (the
	// gateway reads the clock once per request).
	CheckAddrAt(ip netip.Addr, class string, now time.Time) (time.Duration, error)
	CheckUserAt(userID int64, class string, now time.Time) (time.Duration, error)
	Counters() []defense.Counter
}

// Guard classes of the gateway's routes: purchase; join (queue join, polling
// and WebSocket upgrade); draw (the public draw record, with its own
// address buckets); read (every other shopper API route); admin (the
// operator API). Static pages are not checked.
const (
	ClassPurchase = defense.ClassPurchase
	ClassJoin     = defense.ClassJoin
	ClassRead     = defense.ClassRead
	ClassAdmin    = defense.ClassAdmin
	ClassDraw     = defense.ClassDraw
)

// SettingsStore keeps the bot-defense settings and the operator audit log.
// Bodies are JSON documents the store validates (INVALID naming the field).
type SettingsStore interface {
	Get(ctx context.Context) (json.RawMessage, error)
	// PutIf stores body while the stored version is ifVersion (negative:
	// any), VERSION_CONFLICT otherwise.
	PutIf(ctx context.Context, actor string, ifVersion int64, body json.RawMessage) (json.RawMessage, error)
	ApplyPreset(ctx context.Context, actor, name string) (json.RawMessage, error)
	Audit(ctx context.Context, limit int) (json.RawMessage, error)
}

// StaticFile is one embedded page or asset, with its gzip form precomputed
// (Gzip may be nil: then Body is always sent).
type StaticFile struct {
	Body, Gzip   []byte
	ContentType  string
	ETag         string // of Body, quoted, as sent in the ETag header
	GzipETag     string // of Gzip; "" means ETag
	CacheControl string
}

// StaticFiles looks pages up by request path: "/", "/sales/{saleId}",
// "/operator" and "/assets/<path>" (static.Site.Lookup's paths).
type StaticFiles interface {
	Lookup(path string) (StaticFile, bool)
}

// Config tunes the edge. Zero values take the defaults.
type Config struct {
	BodyLimit      int           // bytes; default 16 KiB; over it: 413 TOO_LARGE
	ReadTimeout    time.Duration // default 10s
	WriteTimeout   time.Duration // default 10s
	IdleTimeout    time.Duration // keep-alive; default 60s
	ReadBufferSize int           // request head (request line + headers) limit; default 8 KiB
	// HeadTimeout bounds the first request head of a new connection on
	// the split port, from its first byte (the first byte itself may take
	// FirstByteTimeout); default 5s (or ReadTimeout if shorter).
	HeadTimeout time.Duration
	// FirstByteTimeout bounds how long a new connection may wait before
	// its first byte (a browser opens connections ahead of use); default
	// 10s.
	FirstByteTimeout time.Duration
	// MaxPendingPerAddr caps the connections one client address (an IPv4
	// address, an IPv6 /64) may hold open before their first request
	// head is complete; over it a new connection is closed at once.
	// Default DefaultMaxPendingPerAddr; negative: no cap. Peers inside
	// TrustedProxies are not capped.
	MaxPendingPerAddr int
	// TrustedProxies are the load balancers and proxies in front of the
	// gateway (FLASHSALE_TRUSTED_PROXIES): they carry many clients on
	// their connections, so MaxPendingPerAddr does not count them.
	TrustedProxies []netip.Prefix
	// RequestTimeout bounds every call into a dependency; default 5s.
	RequestTimeout time.Duration
	// CORSOrigins are the origins (scheme://host[:port], or "*") allowed to
	// call the API from a page on another origin; empty: same-origin only.
	CORSOrigins []string
	Now         func() time.Time
	// Correction turns the machine clock into the fleet's (redisclock):
	// with Now nil, a request's time is its arrival time plus Correction.
	// nil: none.
	Correction func() time.Duration
	Ready      func(ctx context.Context) error // for /readyz; nil: always ready
	// SaleRequests, when set, counts every purchase and order request
	// (read, pay, cancel) that reaches its handler: the waiting room's
	// pacing yields to them (waitroom.Config.Competing).
	SaleRequests *atomic.Int64
	// PaymentURL, when set, is the shop's payment page with "{orderId}" in
	// it (FLASHSALE_PAYMENT_URL): a payable order carries it filled in as
	// paymentUrl, and the simulated pay answers 403 FORBIDDEN.
	PaymentURL string
	// DrawLead is how long before a sale's opening its pre-queue closes
	// and its draw runs (waitroom.Config.DrawLead): the sale data carries
	// the seed from then on.
	DrawLead time.Duration
	// DrawCacheBytes bounds the draw records (bodies and gzip forms) a
	// gateway keeps in memory, least recently used evicted first [64 MiB].
	DrawCacheBytes int64
	// DrawIdentityMax is the largest record sent uncompressed; a larger one
	// is sent gzip-encoded to every client, asked or not [1 MiB].
	DrawIdentityMax int64
}

// DefaultMaxPendingPerAddr is Config.MaxPendingPerAddr's default
// (FLASHSALE_MAX_PENDING_CONNS_PER_ADDR): a browser opens at most six
// connections to a host and sends on them within milliseconds, so even a
// NAT of many shoppers rarely holds this many idle at one moment.
const DefaultMaxPendingPerAddr = 64

// DefaultDrawIdentityMax is Config.DrawIdentityMax's default
// (FLASHSALE_DRAW_IDENTITY_MAX), 1 MiB.
const DefaultDrawIdentityMax = 1 << 20

func (c Config) withDefaults() Config {
	if c.DrawCacheBytes <= 0 {
		c.DrawCacheBytes = 64 << 20
	}
	if c.DrawIdentityMax <= 0 {
		c.DrawIdentityMax = DefaultDrawIdentityMax
	}
	if c.BodyLimit <= 0 {
		c.BodyLimit = 16 << 10
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 10 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 60 * time.Second
	}
	if c.ReadBufferSize <= 0 {
		c.ReadBufferSize = 8 << 10
	}
	if c.HeadTimeout <= 0 {
		c.HeadTimeout = min(5*time.Second, c.ReadTimeout)
	}
	if c.FirstByteTimeout <= 0 {
		c.FirstByteTimeout = 10 * time.Second
	}
	if c.MaxPendingPerAddr == 0 {
		c.MaxPendingPerAddr = DefaultMaxPendingPerAddr
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 5 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Deps are the components the gateway calls. All are required except
// Guard (nil: allow everything), Stock (nil: sold-out flags only), Static
// (nil: no pages), Payments (nil: payment callbacks answer 403), Push
// (nil: the push routes answer 404), Reports (nil: the report route
// answers 404), Metrics (nil: a private registry) and Logger (nil:
// discard).
type Deps struct {
	Access    AccessVerifier
	Admission AdmissionVerifier
	Sales     Sales
	Stock     Stock
	SaleAdmin SaleAdmin
	Purchase  Purchaser
	Orders    Orders
	Queue     Queue
	Draws     Draws   // nil: no public draw records
	Reports   Reports // nil: the report route answers 404
	Guard     Guard
	Settings  SettingsStore
	Static    StaticFiles
	Payments  ShopPayments // nil: payment callbacks off (no payment secret)
	Push      Push         // nil: turn notifications off
	Invites   AccessAdmin  // nil: the codes and allowlist routes answer 404
	Metrics   *prometheus.Registry
	Logger    *slog.Logger
}

// Server is the gateway. It serves the public port (Serve) and the admin
// port (ServeAdmin).
type Server struct {
	cfg Config
	d   Deps
	now func() time.Time
	// realClock: cfg.Now is the machine clock (plus cfg.Correction), so a
	// request's own arrival time (fasthttp reads it once per request) can
	// stand for it.
	realClock bool
	log       *slog.Logger
	app       *fiber.App
	metrics   *metrics
	remain    remainingCache
	list      listCache
	draws     drawCache

	// wsMux routes the WebSocket upgrades (serveUpgrade); upgrades
	// counts those being answered, which Shutdown waits for.
	wsMux    http.Handler
	upgrades sync.WaitGroup
	// unavailableLogged is the Unix second of the last UNAVAILABLE logged
	// (logUnavailable).
	unavailableLogged atomic.Int64

	mu     sync.Mutex
	public []*publicPort
	admin  []*http.Server
	closed bool
}

// New builds the gateway and registers its routes and metrics.
func New(cfg Config, deps Deps) *Server {
	realClock := cfg.Now == nil
	if realClock && cfg.Correction != nil {
		corr := cfg.Correction
		cfg.Now = func() time.Time { return time.Now().Add(corr()) }
	}
	cfg = cfg.withDefaults()
	if deps.Guard == nil {
		deps.Guard = allowAll{}
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Metrics == nil {
		deps.Metrics = prometheus.NewRegistry()
	}
	s := &Server{
		cfg:   cfg,
		d:     deps,
		now:   cfg.Now,
		draws: drawCache{max: cfg.DrawCacheBytes},
		log:   deps.Logger.With("component", "gateway"),

		realClock: realClock,
	}
	var err error
	if s.metrics, err = newMetrics(deps.Metrics); err != nil {
		s.log.Error("gateway metrics not exported", "err", err)
	}
	s.remain.m = make(map[int64]*remainingEntry)
	s.app = fiber.New(fiber.Config{
		AppName:               "flashsale",
		DisableStartupMessage: true,
		BodyLimit:             cfg.BodyLimit,
		ReadBufferSize:        cfg.ReadBufferSize,
		// ReadTimeout, WriteTimeout and IdleTimeout are enforced by the
		// watchdog (internal/conn/watchdog), not by per-request deadlines.
		ErrorHandler:       s.fiberError,
		DisableDefaultDate: true,
		StrictRouting:      false,
		CaseSensitive:      true,
	})
	// Upgrades forwarded from fiber keep their connection (forwardUpgrade).
	s.app.Server().KeepHijackedConns = true
	s.routes()
	s.wsMux = s.wsHandler()
	return s
}

// App is the fiber application, for tests and benchmarks (app.Test).
func (s *Server) App() *fiber.App { return s.app }

// Serve serves the public port on ln until Shutdown, then returns nil. Each
// new connection is routed by its first request head: `Upgrade: websocket`
// is answered by serveUpgrade (Deps.Queue), everything else by fiber.
func (s *Server) Serve(ln net.Listener) error {
	wd := watchdog.New(watchdog.Config{Read: s.cfg.ReadTimeout, Idle: s.cfg.IdleTimeout, Write: s.cfg.WriteTimeout}, s.metrics.timeouts)
	defer wd.Stop()
	sp := split.New(ln, split.Config{
		MaxHead:           s.cfg.ReadBufferSize,
		FirstByteTimeout:  s.cfg.FirstByteTimeout,
		HeadTimeout:       s.cfg.HeadTimeout,
		MaxPendingPerAddr: s.cfg.MaxPendingPerAddr,
		TrustedProxies:    s.cfg.TrustedProxies,
	}, split.Deps{
		Refuse:       refuseFirstHead,
		WrapHTTP:     func(c net.Conn) net.Conn { return newEdgeConn(wd.Watch(c)) },
		Upgrade:      s.serveUpgrade,
		Refused:      s.metrics.pendingRefused,
		IdleTimeouts: s.metrics.timeouts.WithLabelValues("idle"),
		HeadTimeouts: s.metrics.timeouts.WithLabelValues("head"),
		Logger:       s.log,
	})
	pp := &publicPort{sp: sp, wd: wd}
	if !s.track(ln, func() { s.public = append(s.public, pp) }) {
		return nil
	}

	errc := make(chan error, 2)
	go func() { errc <- s.app.Listener(sp.HTTP()) }()
	go func() { errc <- sp.Run() }()
	err := <-errc
	pp.close()
	if e := <-errc; err == nil {
		err = e
	}
	if s.isClosed() {
		return nil
	}
	return err
}

// Shutdown stops accepting connections and waits for in-flight requests to
// finish, within ctx. Hijacked WebSocket connections are the Queue's to
// close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	pps := s.public
	admins := s.admin
	s.mu.Unlock()

	for _, pp := range pps {
		pp.close()
	}
	var errs []error
	if err := s.app.ShutdownWithContext(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, a := range admins {
		if err := a.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, pp := range pps {
		if err := pp.sp.Wait(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := waitGroupCtx(ctx, &s.upgrades); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gateway.Shutdown: %w", err)
	}
	return nil
}

// track runs add under s.mu, so that Shutdown sees what it registers,
// unless the server is closed already: then it closes ln and reports
// false.
func (s *Server) track(ln net.Listener, add func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = ln.Close()
		return false
	}
	add()
	return true
}

// waitGroupCtx waits for wg within ctx.
func waitGroupCtx(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// reqNow is the time of request c: the time fasthttp read at its arrival
// when the clock is real, Config.Now otherwise. Reading it once per request
// and passing it on saves a clock read per check.
func (s *Server) reqNow(c *fiber.Ctx) time.Time {
	if s.realClock {
		if s.cfg.Correction != nil {
			return c.Context().Time().Add(s.cfg.Correction())
		}
		return c.Context().Time()
	}
	return s.now()
}

// reqCtx bounds a call into a dependency.
func (s *Server) reqCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
}

// allowAll is the Guard used when none is configured.
type allowAll struct{}

func (allowAll) ClientAddr(peer netip.Addr, _ string) netip.Addr { return peer }
func (allowAll) CheckAddrAt(netip.Addr, string, time.Time) (time.Duration, error) {
	return 0, nil
}
func (allowAll) CheckUserAt(int64, string, time.Time) (time.Duration, error) { return 0, nil }
func (allowAll) Counters() []defense.Counter                                 { return nil }

// seedPublic reports whether the sale's seed may be shown at now: from the
// pre-queue's close (DrawLead before the opening), when the draw is made.
func (s *Server) seedPublic(sale *flashsale.Sale, now time.Time) bool {
	return len(sale.ShuffleSeed) > 0 && !now.Before(sale.StartsAt.Add(-max(0, s.cfg.DrawLead)))
}
