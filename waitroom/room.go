// Package waitroom is the virtual queue in front of a flash sale: shoppers
// join over a WebSocket (or by polling), get a place, see their position and
// an ETA, and receive an admission token when their turn comes.
//
// The queue lives in Redis so that any number of gateways share it (keys in
// store.go). Joins are collected for a few milliseconds and registered with
// one script call per batch and sale. Each gateway runs one tick loop: per
// tick and sale it reads the stock (StockSource) and runs one script that
// also lets the leader (a Redis lease) advance the shared "now serving"
// cursor at the sale's admission rate, capped by the remaining stock. Every
// gateway then computes the position of each of its own connections in
// memory and pushes a status to those whose view changed. Places before the
// opening are ordered by a published draw (draw.go, docs/DRAW.md).
//
// Faults: an admitted shopper whom no gateway has held a connection of for
// Config.AdmittedGrace no longer counts against the capacity cap (each
// gateway marks its admitted shoppers present; the leader counts those
// whose mark lapsed as gone), so a gateway that dies does not freeze
// admission. A queue that Redis lost, or holds only in part, is restored
// from the checkpoint in PostgreSQL (Config.Durable) and the gateways'
// connections before any join or tick goes on (restore.go). The leader
// lease is short (Config.LeaseTTL), so another gateway leads within
// seconds of the leader's death.
//
// Blocking rules: Join and Status block for at most one join batch and a few
// Redis round trips (bounded by ctx). ServeHTTP blocks for the life of its
// WebSocket. Writes to WebSockets are done by a small pool of writers with a
// write timeout; a slow client is dropped, never waited on by the tick.
package waitroom

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/admission"
	"github.com/flashsale/flashsale/lua"
)

// SaleSource is the gateway's in-memory sale cache.
type SaleSource interface {
	Sale(id int64) (*flashsale.Sale, bool)
}

// StockSource reads a sale's remaining stock (itemID → remaining) from Redis.
type StockSource interface {
	Remaining(ctx context.Context, saleID int64) (map[int64]int64, error)
}

// AccessVerifier checks access tokens (*auth.Verifier).
type AccessVerifier interface {
	Verify(token string) (flashsale.Principal, error)
}

// JoinGuard is bot defense at join. (nil, nil) lets the join through; a
// non-nil challenge is sent to the shopper, who must join again with "pow";
// an error (a *flashsale.Error such as BLOCKED or RATE_LIMITED) refuses the
// join.
type JoinGuard interface {
	CheckJoin(ctx context.Context, ip netip.Addr, userID, saleID int64, pow json.RawMessage) (challenge json.RawMessage, err error)
}

// Config configures a Room. Zero values take the defaults in brackets.
type Config struct {
	AdmissionTTL     time.Duration // validity of an admission token [5m]
	Tick             time.Duration // state read and status push period [250ms]
	HandshakeTimeout time.Duration // first message deadline [10s]
	IdleTimeout      time.Duration // a connection that answers no ping for this long is closed [60s]
	WriteTimeout     time.Duration // a write that takes longer drops the client [5s]
	// ResumeDelay is how long stock must have been back after a sell-out
	// before shoppers are told (SOLD_OUT → ADMITTED/WAITING). It must
	// exceed the purchase service's sold-out flag recheck (500ms), so a
	// shopper told "buy now" does not meet a stale 410 [750ms; negative:
	// no delay].
	ResumeDelay     time.Duration
	MaxMessageBytes int64 // largest client message [4096]
	MaxConnsPerIP   int   // [DefaultMaxConnsPerIP]
	// MaxConns caps this process's WebSocket connections (0: no cap). Set
	// it below the open-file limit, so a crowd cannot starve the process of
	// the descriptors its Redis, PostgreSQL and Kafka connections need.
	MaxConns        int
	MaxConnsPerUser int           // [4]
	CapacityFactor  float64       // admitted-unused places ≤ factor × remaining stock [2.0]
	OriginPatterns  []string      // cross-origin pages allowed to open the WebSocket
	JoinBatchWindow time.Duration // how long joins are collected into one batch [2ms]
	MaxJoinBatch    int           // largest join batch [1000]
	LeaseTTL        time.Duration // leader lease [max(2s, 4 ticks)]
	Writers         int           // WebSocket writer goroutines [8 × GOMAXPROCS]
	// StatusEvery is the least time between two WAITING statuses to one
	// connection (position and ETA updates) [2s].
	StatusEvery time.Duration
	// WaitingPushes caps the WAITING statuses (a new place, a new
	// position) plus admissions this process queues per second [1000;
	// negative: no cap]. At a drop's opening every shopper of the
	// pre-queue gets a place and, while the cursor moves, a new position:
	// sending all of those at once would take the CPU the admitted
	// shoppers' purchases need. Admissions go first and are never held
	// back; WAITING statuses use what is left, front of the queue first,
	// entries before position updates. SOLD_OUT, ENDED and PREQUEUE
	// statuses are not paced, and admission messages are written before
	// any status.
	WaitingPushes int
	// Competing returns a running count of this process's requests that
	// compete with the room for CPU while a sale sells: purchases, order
	// reads and payments [nil: none]. A regular tick's WAITING budget is
	// lowered by the requests since the tick before, down to a tenth of
	// WaitingPushes, and while that many came in, a connection's ping may
	// wait one ping period (never two in a row): in a drop's selling
	// seconds the CPU goes to the purchases, and the positions and pings
	// catch up once they calm down.
	Competing func() int64
	// AdmittedGrace is how long an admitted shopper may be away before its
	// place stops counting against the capacity cap: no gateway holds a
	// connection of it (or answered a poll of it) for this long. Gateways
	// mark their admitted shoppers present every AdmittedGrace/4, so a
	// gateway that dies (even by kill -9, which runs no close handler)
	// lets its shoppers lapse; a shopper back on any gateway within its
	// token's life counts again. The token stays valid: the stock in Redis
	// is what guards against overselling, the cap only paces admission
	// [20s; negative: an admitted place counts until its token expires].
	AdmittedGrace time.Duration
	// Durable keeps the queue's tickets, draw and cursor across a Redis
	// loss (the sale's leader checkpoints them every CheckpointEvery) [nil:
	// a lost queue is rebuilt from the gateways' connections alone].
	Durable Durable
	// CheckpointEvery is the leader's checkpoint period [1s].
	CheckpointEvery time.Duration
	// Now is the clock [time.Now].
	Now func() time.Time
	// ClientIP returns the client address of a WebSocket request [the
	// address of RemoteAddr].
	ClientIP func(*http.Request) netip.Addr
}

// DefaultMaxConnsPerIP is how many room connections one client address may
// hold on one gateway unless Config.MaxConnsPerIP says otherwise
// (FLASHSALE_WS_MAX_CONNS_PER_ADDR); the load harness warns a run that
// would pass it.
const DefaultMaxConnsPerIP = 200

// DefaultAdmittedGrace is Config.AdmittedGrace's default
// (FLASHSALE_ADMITTED_GRACE).
const DefaultAdmittedGrace = 20 * time.Second

// beatEvery is how often a gateway marks its admitted shoppers present: a
// quarter of the grace, so a live shopper is never taken for gone.
func (c *Config) beatEvery() time.Duration { return max(c.Tick, c.AdmittedGrace/4) }

func (c *Config) defaults() {
	setDur := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	setDur(&c.AdmissionTTL, 5*time.Minute)
	setDur(&c.Tick, 250*time.Millisecond)
	setDur(&c.HandshakeTimeout, 10*time.Second)
	setDur(&c.IdleTimeout, 60*time.Second)
	setDur(&c.WriteTimeout, 5*time.Second)
	if c.ResumeDelay == 0 {
		c.ResumeDelay = 750 * time.Millisecond
	}
	setDur(&c.JoinBatchWindow, 2*time.Millisecond)
	setDur(&c.LeaseTTL, max(2*time.Second, 4*c.Tick))
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 4096
	}
	if c.MaxConnsPerIP <= 0 {
		c.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	if c.MaxConnsPerUser <= 0 {
		c.MaxConnsPerUser = 4
	}
	if c.CapacityFactor <= 0 {
		c.CapacityFactor = 2.0
	}
	if c.MaxJoinBatch <= 0 {
		c.MaxJoinBatch = 1000
	}
	if c.Writers <= 0 {
		c.Writers = 8 * runtime.GOMAXPROCS(0)
	}
	setDur(&c.StatusEvery, 2*time.Second)
	if c.AdmittedGrace == 0 {
		c.AdmittedGrace = DefaultAdmittedGrace
	}
	setDur(&c.CheckpointEvery, time.Second)
	if c.WaitingPushes == 0 {
		c.WaitingPushes = 1000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ClientIP == nil {
		c.ClientIP = remoteIP
	}
}

func remoteIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// bucketMs is the width of the admission-count buckets of the capacity cap.
const bucketMs = 1000

// rateSamples is how many ticks the measured admission rate looks back.
const rateSamples = 16

type metrics struct {
	joined    prometheus.Counter
	waiting   prometheus.Gauge
	admitted  prometheus.Counter
	conns     prometheus.Gauge
	broadcast prometheus.Histogram
	deferred  prometheus.Counter
	pings     *prometheus.CounterVec
	restores  prometheus.Counter
	saves     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		joined: prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_waitroom_joined_total",
			Help: "Joins handled by this gateway (WebSocket and polling)."}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flashsale_waitroom_waiting",
			Help: "Shoppers connected to this gateway who wait (PREQUEUE or WAITING)."}),
		admitted: prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_waitroom_admitted_total",
			Help: "Places admitted by this gateway while it led a sale's queue."}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flashsale_waitroom_connections",
			Help: "Open waiting-room WebSockets on this gateway."}),
		broadcast: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "flashsale_waitroom_broadcast_duration_seconds",
			Help:    "Time to compute and queue the status of every local connection of a sale, per tick.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 8)}),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_waitroom_status_deferred_total",
			Help: "WAITING statuses held for a later tick by the pacing (Config.WaitingPushes)."}),
		pings: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flashsale_waitroom_pings_total",
			Help: "Keep-alive pings by outcome: sent, or waited (a ping slot skipped for the sale's requests, Config.Competing)."},
			[]string{"outcome"}),
		restores: prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_waitroom_restores_total",
			Help: "Queues this gateway rebuilt in Redis (lost, or behind what it knew) from the checkpoint and its connections."}),
		saves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flashsale_waitroom_checkpoints_total",
			Help: "Queue checkpoints to the durable store by this gateway as a sale's leader, by outcome (ok, error)."},
			[]string{"outcome"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.joined, m.waiting, m.admitted, m.conns, m.broadcast, m.deferred, m.pings, m.restores, m.saves} {
			if err := reg.Register(c); err != nil {
				return m, err
			}
		}
	}
	return m, nil
}

// Room is the waiting room of every sale, on one gateway.
type Room struct {
	cfg    Config
	rdb    redis.UniversalClient
	sales  SaleSource
	stock  StockSource
	access AccessVerifier
	signer *admission.Signer
	guard  JoinGuard
	log    *slog.Logger
	m      *metrics
	id     string // leader lease owner id
	// restores numbers this gateway's restores (their epochs).
	restores atomic.Int64

	joins chan *joinReq
	// drawn wakes the checkpoint loop when this gateway, leading, sees a
	// sale's draw: the pre-queue's membership goes to Durable at once.
	drawn chan struct{}

	mu        sync.Mutex
	rooms     map[int64]*saleRoom
	perIP     map[netip.Addr]int
	total     int // WebSocket connections of this process (MaxConns)
	perUser   map[int64]int
	conns     map[*conn]struct{}
	closing   bool
	connSeq   uint64
	handlers  sync.WaitGroup
	pings     sync.WaitGroup
	tickCount uint64
	// Config.Competing at the last regular tick, and its rise over the
	// tick before (tick loop only).
	competing, competingDelta int64

	sendMu   sync.Mutex
	sendCond *sync.Cond
	sendHi   []*conn // connections with an admission message: written first
	sendQ    []*conn
	sendStop bool
}

// New returns a Room. guard may be nil. Run must run for joins to be
// registered and statuses to be pushed.
func New(cfg Config, rdb redis.UniversalClient, sales SaleSource, stock StockSource, access AccessVerifier,
	signer *admission.Signer, guard JoinGuard, logger *slog.Logger, reg prometheus.Registerer) *Room {
	cfg.defaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "waitroom")
	m, err := newMetrics(reg)
	if err != nil {
		logger.Error("register metrics", "err", err)
	}
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	r := &Room{
		cfg: cfg, rdb: rdb, sales: sales, stock: stock, access: access, signer: signer, guard: guard,
		log: logger, m: m, id: hex.EncodeToString(idb[:]),
		joins:   make(chan *joinReq, 4*cfg.MaxJoinBatch),
		drawn:   make(chan struct{}, 1),
		rooms:   map[int64]*saleRoom{},
		perIP:   map[netip.Addr]int{},
		perUser: map[int64]int{},
		conns:   map[*conn]struct{}{},
	}
	r.sendCond = sync.NewCond(&r.sendMu)
	return r
}

// Run registers join batches, pushes statuses and advances the queues of
// the sales this gateway leads until ctx ends; then it returns nil.
func (r *Room) Run(ctx context.Context) error {
	if err := loadScripts(ctx, r.rdb); err != nil && ctx.Err() == nil {
		r.log.Warn("load scripts", "err", err) // Script.Run falls back to EVAL
	}
	r.sendMu.Lock()
	r.sendStop = false
	r.sendMu.Unlock()
	var wg sync.WaitGroup
	for range r.cfg.Writers {
		wg.Go(r.writer)
	}
	wg.Go(func() { r.batcher(ctx) })
	wg.Go(func() { r.advanceLoop(ctx) })
	wg.Go(func() { r.checkpointLoop(ctx) })
	t := time.NewTicker(r.cfg.Tick)
	defer t.Stop()
	// A sale opening before the next tick gets a tick of its own right
	// after its opening instant, so the draw and the first admissions do
	// not wait for the ticker's phase (up to a whole Tick).
	opening := time.NewTimer(time.Hour)
	defer opening.Stop()
	regular := true
	for {
		if d := r.tickAll(ctx, regular); d > 0 {
			opening.Reset(d + openingSlack)
		}
		select {
		case <-opening.C:
			regular = false
			continue
		case <-ctx.Done():
			r.sendMu.Lock()
			r.sendStop = true
			r.sendCond.Broadcast()
			r.sendMu.Unlock()
			wg.Wait()
			return nil
		case <-t.C:
			regular = true
		}
	}
}

// advanceLoop moves the admission cursor of the sales this gateway leads
// once a Tick, apart from the tick loop. A broadcast goes over every local
// connection and, on a gateway starved of CPU, took over 1.6 s three times
// in a 100,000-shopper drop; while the leader's tick loop sat in it, no
// gateway admitted anyone (the cursor stood still for 1.25 s and 2 s).
// This loop does two Redis calls and little else, so it keeps the rate.
func (r *Room) advanceLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.Tick)
	defer t.Stop()
	var rooms []*saleRoom
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rooms = r.appendRooms(rooms[:0])
		for _, sr := range rooms {
			sr.mu.Lock()
			leading := sr.leadAt >= 0
			sr.mu.Unlock()
			if !leading {
				continue
			}
			if _, err := r.refresh(ctx, sr.id, r.cfg.Now()); err != nil && ctx.Err() == nil {
				r.log.Warn("advance sale", "sale", sr.id, "err", err)
			}
		}
	}
}

// appendRooms appends this gateway's sale rooms to dst, so a loop can
// work through them without holding r.mu.
func (r *Room) appendRooms(dst []*saleRoom) []*saleRoom {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, sr := range r.rooms {
		dst = append(dst, sr)
	}
	return dst
}

// saleRoom is one sale's local view: its connections and the last queue
// state read from Redis.
type saleRoom struct {
	id         int64
	registered bool // in activeKey (guarded by Room.mu)

	mu      sync.Mutex
	conns   map[*conn]struct{}
	sale    *flashsale.Sale
	items   []AdmittedItem
	itemsJS []byte // items, JSON-encoded once for the admitted messages
	loaded  bool
	st      queueState
	soldOut bool
	// availableSince is when stock was first seen back after a sell-out
	// (zero while sold out or never sold out); see Config.ResumeDelay.
	availableSince time.Time
	perm           *Permuter
	entering       []dueStatus // scratch of broadcast
	moved          []dueStatus // scratch of broadcast
	touched        time.Time   // last polling use
	samples        [rateSamples]struct{ ms, serving int64 }
	nsample        int
	leadAt         int64     // serving when this gateway last led (-1: not leading)
	lastBeat       time.Time // last presence mark of the admitted connections

	// What Durable holds, as far as this gateway knows: checked once
	// (pgChecked), then kept up by its own checkpoints. savedSeq is the
	// number of tickets saved (-1: unknown); savedN and savedServing what
	// the last checkpoint wrote (a checkpoint with nothing new is skipped).
	pgChecked            bool
	pgAsked              bool       // the first tick's check ran
	askMu                sync.Mutex // held by the first check (firstCheck)
	pgHas                bool
	pgSt                 queueState
	savedSeq             int64
	savedN, savedServing int64

	restoreMu sync.Mutex // one restore of the sale at a time on this gateway
	// The queue's restore epoch as last seen (see restoreScript).
	epoch     string
	epochSeen bool
}

// known is what this gateway knows of the queue, for the scripts' guard.
// Called with sr.mu held.
func (sr *saleRoom) known() known {
	st := sr.st
	st.Seq = max(st.Seq, sr.pgSt.Seq)
	st.Serving = max(st.Serving, sr.pgSt.Serving)
	if st.N < 0 {
		st.N = sr.pgSt.N
	}
	return known{st: st, guard: sr.pgHas || st.Seq > 0 || st.N >= 0 || st.Serving > 0}
}

func (sr *saleRoom) knownNow() known {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	return sr.known()
}

func (r *Room) saleRoom(id int64, create bool) *saleRoom {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.rooms[id]
	if sr == nil && create {
		sr = &saleRoom{id: id, conns: map[*conn]struct{}{}, leadAt: -1, st: queueState{N: -1},
			pgSt: queueState{N: -1}, savedSeq: -1, savedN: -1}
		r.rooms[id] = sr
	}
	return sr
}

// observe takes a newer queue state (the cursor only moves forward).
// Called with sr.mu held.
func (sr *saleRoom) observe(st queueState) {
	if st.Seq > sr.st.Seq {
		sr.st.Seq = st.Seq
	}
	if st.N >= 0 && sr.st.N < 0 {
		sr.st.N = st.N
	}
	if st.Serving > sr.st.Serving {
		sr.st.Serving = st.Serving
	}
	if sr.st.N >= 0 && sr.perm == nil && sr.sale != nil && sr.st.N > 0 {
		sr.perm = NewPermuter(sr.sale.ShuffleSeed, uint64(sr.st.N))
	}
}

// place returns the place of ticket (ok false before the draw). Called
// with sr.mu held.
func (sr *saleRoom) place(ticket int64) (int64, bool) {
	if sr.st.N < 0 {
		return 0, false
	}
	if ticket < sr.st.N {
		if sr.perm == nil {
			return 0, false
		}
		return int64(sr.perm.Place(uint64(ticket))), true
	}
	return ticket, true
}

// rate is the measured admission rate (places/s over the last ticks), or
// the configured rate when nothing was measured. Called with sr.mu held.
func (sr *saleRoom) rate() float64 {
	n := min(sr.nsample, rateSamples)
	if n >= 2 {
		newest := sr.samples[(sr.nsample-1)%rateSamples]
		oldest := sr.samples[(sr.nsample-n)%rateSamples]
		d := newest.ms - oldest.ms
		if d > 0 && newest.serving > oldest.serving {
			return float64(newest.serving-oldest.serving) * 1000 / float64(d)
		}
		// Admission stalled over the window (the stock cap holds it back
		// until purchases or expiries free places): the average since
		// opening says more than the configured rate, which is not being
		// reached.
		if s := sr.sale; d > 0 && s != nil {
			if open := newest.ms - s.StartsAt.UnixMilli(); open > 0 && newest.serving > 0 {
				return float64(newest.serving) * 1000 / float64(open)
			}
		}
	}
	if sr.sale != nil && sr.sale.AdmissionRatePerSecond > 0 {
		return float64(sr.sale.AdmissionRatePerSecond)
	}
	return 0
}

// viewOf is what a shopper with this ticket (and place, -1 unknown) sees
// now. Called with sr.mu held.
func (sr *saleRoom) viewOf(place int64, now time.Time) view {
	s := sr.sale
	switch {
	case s != nil && !s.EndsAt.IsZero() && !now.Before(s.EndsAt):
		return view{state: StateEnded}
	case sr.soldOut:
		return view{state: StateSoldOut}
	case place < 0:
		return view{state: StatePrequeue}
	case place < sr.st.Serving:
		return view{state: StateAdmitted}
	}
	pos := place - sr.st.Serving
	v := view{state: StateWaiting, position: pos}
	if rt := sr.rate(); rt > 0 {
		v.eta = int64(math.Ceil(float64(pos+1) / rt))
	}
	return v
}

// refresh reads one sale's stock and queue state (and, as leader,
// advances its queue). It returns the sale room, or nil when the sale is
// unknown.
func (r *Room) refresh(ctx context.Context, id int64, now time.Time) (*saleRoom, error) {
	sale, ok := r.sales.Sale(id)
	if !ok {
		return nil, nil
	}
	// The stock is known only when every item of the sale has a record: a
	// Redis that just lost the stock (the reconciler rebuilds it) says
	// nothing about it. Unknown stock admits nobody and changes no
	// sold-out state; it is not zero.
	rem, err := r.stock.Remaining(ctx, id)
	if err != nil {
		r.log.Warn("read stock", "sale", id, "err", err)
	}
	total, soldOut, stockKnown := int64(0), true, err == nil && len(sale.Items) > 0
	for _, it := range sale.Items {
		v, ok := rem[it.ID]
		if !ok {
			stockKnown = false
			break
		}
		if v > 0 {
			total += v
			soldOut = false
		}
	}
	capLimit := int64(-1)
	ended := !sale.EndsAt.IsZero() && !now.Before(sale.EndsAt)
	if stockKnown && !ended {
		capLimit = int64(math.Floor(r.cfg.CapacityFactor * float64(total)))
	}
	sr := r.saleRoom(id, true)
	r.firstCheck(ctx, sr)
	grace := r.cfg.AdmittedGrace.Milliseconds()
	if grace < 0 {
		grace = 0
	}
	var rep tickReply
	for attempt := 0; ; attempt++ {
		rep, err = tickSale(ctx, r.rdb, sale, tickArgs{
			me: r.id, nowMs: now.UnixMilli(), leaseMs: r.cfg.LeaseTTL.Milliseconds(), rate: sale.AdmissionRatePerSecond,
			capLimit: capLimit, ttlMs: r.cfg.AdmissionTTL.Milliseconds(), bucketMs: bucketMs, graceMs: grace,
			known: sr.knownNow(),
		})
		if err != nil {
			return nil, err
		}
		// A new epoch: another gateway restored the queue after a loss;
		// this one brings its connections in too.
		sr.mu.Lock()
		moved := sr.epochSeen && rep.epoch != sr.epoch
		if !rep.stale && !moved {
			sr.epoch, sr.epochSeen = rep.epoch, true
		}
		sr.mu.Unlock()
		if !rep.stale && !moved {
			break
		}
		if attempt > 0 {
			return nil, fmt.Errorf("waitroom.refresh: sale %d: %w", id, errStale)
		}
		if err := r.restore(ctx, sr, now); err != nil {
			return nil, err
		}
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.sale == nil || sr.sale != sale {
		sr.items = admittedItems(sale)
		sr.itemsJS, _ = json.Marshal(sr.items)
	}
	sr.sale = sale
	leader, st := rep.leader, rep.st
	drawnBefore := sr.st.N >= 0
	sr.observe(st)
	sr.loaded = true
	if stockKnown {
		sr.soldOut = r.resumeHeld(sr, soldOut, now)
	}
	if leader && !drawnBefore && sr.st.N >= 0 {
		select {
		case r.drawn <- struct{}{}:
		default:
		}
	}
	// The tick loop and advanceLoop both refresh: keep the samples in time
	// order and count each admitted place once.
	if sr.nsample == 0 || now.UnixMilli() > sr.samples[(sr.nsample-1)%rateSamples].ms {
		sr.samples[sr.nsample%rateSamples] = struct{ ms, serving int64 }{now.UnixMilli(), sr.st.Serving}
		sr.nsample++
	}
	if leader {
		if sr.leadAt >= 0 && st.Serving > sr.leadAt {
			r.m.admitted.Add(float64(st.Serving - sr.leadAt))
		}
		sr.leadAt = max(sr.leadAt, st.Serving)
	} else {
		sr.leadAt = -1
	}
	return sr, nil
}

// firstCheck asks Durable, once, whether the sale's queue existed. A
// gateway that has just started knows nothing of the queue; its first
// tick or join must not take an empty Redis for a new queue when the
// checkpoint says otherwise. Asked once (the checkpoint loop asks again
// until it knows), so a PostgreSQL outage costs one bounded wait, not one
// per tick.
func (r *Room) firstCheck(ctx context.Context, sr *saleRoom) {
	if r.cfg.Durable == nil {
		return
	}
	// Concurrent first looks (a poll, the tick loop) wait for the one
	// check: none may tick before it is answered.
	sr.askMu.Lock()
	defer sr.askMu.Unlock()
	sr.mu.Lock()
	first := !sr.pgChecked && !sr.pgAsked
	sr.pgAsked = true
	sr.mu.Unlock()
	if !first {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, firstCheckTimeout)
	defer cancel()
	if err := r.checkSaved(cctx, sr); err != nil && ctx.Err() == nil {
		r.log.Warn("read the queue checkpoint", "sale", sr.id, "err", err)
	}
}

// openingSlack is how long after a sale's opening instant its own tick
// runs (clocks of gateways and Redis differ by a little).
const openingSlack = 2 * time.Millisecond

// tickAll runs one tick over every sale this gateway serves or that has a
// queue in Redis. It returns how long until the earliest opening of those
// sales that falls before the next tick (0: none does). An extra tick
// (regular false: one run for an opening between two ticks) keeps the tick
// count, so it sends no pings and does not hasten the paced statuses.
func (r *Room) tickAll(ctx context.Context, regular bool) (untilOpening time.Duration) {
	if ctx.Err() != nil {
		return 0
	}
	now := r.cfg.Now()
	ids := map[int64]bool{}
	r.mu.Lock()
	if regular {
		r.tickCount++
	}
	tick := r.tickCount
	for id := range r.rooms {
		ids[id] = true
	}
	r.mu.Unlock()
	active, err := r.rdb.SMembers(ctx, activeKey).Result()
	if err != nil && ctx.Err() == nil {
		r.log.Warn("read active sales", "err", err)
	}
	for _, s := range active {
		if id, err := strconv.ParseInt(s, 10, 64); err == nil {
			ids[id] = true
		}
	}
	// Requests since the last regular tick; an extra tick uses the last
	// regular tick's figure.
	if regular && r.cfg.Competing != nil {
		n := r.cfg.Competing()
		r.competingDelta, r.competing = n-r.competing, n
	}
	competing := r.competingDelta
	waiting := 0
	for id := range ids {
		sr, err := r.refresh(ctx, id, now)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("tick sale", "sale", id, "err", err)
			}
			continue
		}
		if sr == nil {
			continue
		}
		waiting += r.broadcast(ctx, sr, now, tick, regular, competing)
		r.retire(ctx, sr, now)
		if d := sr.untilOpening(now, r.cfg.Tick); d > 0 && (untilOpening == 0 || d < untilOpening) {
			untilOpening = d
		}
	}
	r.m.waiting.Set(float64(waiting))
	return untilOpening
}

// untilOpening is how long until the sale's opening when it falls within
// the next tick; for an open sale whose draw this gateway has not seen yet
// (the leader makes it), a tenth of tick, so that the other gateways learn
// the draw soon after the opening. 0: no early tick needed.
func (sr *saleRoom) untilOpening(now time.Time, tick time.Duration) time.Duration {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.sale == nil {
		return 0
	}
	d := sr.sale.StartsAt.Sub(now)
	switch {
	case d > 0 && d <= tick:
		return d
	case d <= 0 && sr.st.N < 0 && len(sr.conns) > 0 && -d < 10*tick:
		return tick / 10
	}
	return 0
}

// retire forgets a sale that has ended and has no local connections.
func (r *Room) retire(ctx context.Context, sr *saleRoom, now time.Time) {
	sr.mu.Lock()
	ended := sr.sale != nil && !sr.sale.EndsAt.IsZero() && now.After(sr.sale.EndsAt.Add(time.Minute))
	idle := len(sr.conns) == 0 && now.Sub(sr.touched) > time.Minute
	sr.mu.Unlock()
	if !ended || !idle {
		return
	}
	r.mu.Lock()
	delete(r.rooms, sr.id)
	r.mu.Unlock()
	if err := r.rdb.SRem(ctx, activeKey, sr.id).Err(); err != nil {
		r.log.Warn("retire sale", "sale", sr.id, "err", err)
	}
}

// broadcast computes the view of every local connection of the sale,
// records new admissions with one script call and queues the changed
// statuses. It never writes to a socket. It returns the number of local
// connections waiting.
func (r *Room) broadcast(ctx context.Context, sr *saleRoom, now time.Time, tick uint64, regular bool, competing int64) int {
	start := time.Now()
	defer func() { r.m.broadcast.Observe(time.Since(start).Seconds()) }()
	var admit, expired []*conn
	var present []heldConn
	ttlMs := r.cfg.AdmissionTTL.Milliseconds()
	waiting := 0
	pingSlots := uint64(max(1, r.cfg.IdleTimeout/2/r.cfg.Tick))
	statusSlots := uint64(max(1, r.cfg.StatusEvery/r.cfg.Tick))
	var ping, kick []*conn
	// A tick's full WAITING budget, and whether the sale's requests took
	// a tenth of it or more since the tick before (see Config.Competing).
	full := max(1, int(float64(r.cfg.WaitingPushes)*r.cfg.Tick.Seconds()))
	busy := r.cfg.WaitingPushes > 0 && competing > 0 && competing >= int64(full/10)
	waited := 0
	blocker, _ := r.guard.(Blocker)
	sr.mu.Lock()
	opens := sr.sale.StartsAt.UnixMilli()
	// Presence: every beatEvery, the admitted shoppers connected here are
	// marked present, so that the leader does not count them gone.
	beat := regular && r.cfg.AdmittedGrace > 0 && now.Sub(sr.lastBeat) >= r.cfg.beatEvery()
	if beat {
		sr.lastBeat = now
	}
	// WAITING statuses due: shoppers entering WAITING, then position
	// updates; sent after the loop, front of the queue first, within the
	// tick's budget.
	entering, moved := sr.entering[:0], sr.moved[:0]
	for c := range sr.conns {
		if blocker != nil && len(kick) < maxKicksPerTick && blocker.Blocked(c.ip, c.user) {
			kick = append(kick, c)
			continue
		}
		if regular && c.seq%pingSlots == tick%pingSlots {
			if busy && !c.pingWaited {
				c.pingWaited = true
				waited++
			} else {
				c.pingWaited = false
				ping = append(ping, c)
			}
		}
		if c.place < 0 {
			if p, ok := sr.place(c.ticket); ok {
				c.place = p
			}
		}
		if beat && c.admittedAt != 0 && !c.bought && now.UnixMilli() < c.admittedAt+ttlMs {
			present = append(present, heldConn{user: c.user, place: c.place})
		}
		v := sr.viewOf(c.place, now)
		if v.state == StateAdmitted && c.admittedAt == 0 {
			admit = append(admit, c)
			continue
		}
		if v.state == StateAdmitted && c.admittedAt != 0 && !c.bought && now.UnixMilli() >= c.admittedAt+ttlMs &&
			len(expired) < maxRequeuePerTick {
			expired = append(expired, c)
			continue
		}
		if v.state == StateWaiting || v.state == StatePrequeue {
			waiting++
		}
		if v == c.last {
			continue
		}
		if v.state == StateWaiting {
			if c.last.state != StateWaiting {
				entering = append(entering, dueStatus{c, v})
			} else if tick-c.lastTick >= statusSlots {
				moved = append(moved, dueStatus{c, v})
			}
			continue
		}
		c.last, c.lastTick = v, tick
		c.push(v, opens, nil)
	}
	// The budget is shared with this tick's admissions, which go first,
	// then with the requests competing since the last tick, down to a
	// tenth of it.
	budget := -1 // no cap
	if r.cfg.WaitingPushes > 0 {
		budget = max(0, full-len(admit))
		if competing > 0 {
			budget = max(min(budget, full/10), budget-int(min(competing, int64(full))))
		}
	}
	deferred := 0
	for _, due := range [][]dueStatus{entering, moved} {
		if budget >= 0 && len(due) > budget {
			// Front of the queue first; with no budget left (a tick of
			// many admissions, as at an opening) there is nothing to pick.
			if budget > 0 {
				slices.SortFunc(due, func(a, b dueStatus) int { return cmp.Compare(a.c.place, b.c.place) })
			}
			deferred += len(due) - budget
			due = due[:budget]
		}
		for _, d := range due {
			d.c.last, d.c.lastTick = d.v, tick
			d.c.push(d.v, opens, nil)
		}
		if budget >= 0 {
			budget -= len(due)
		}
	}
	clear(entering)
	clear(moved)
	sr.entering, sr.moved = entering[:0], moved[:0]
	sr.mu.Unlock()
	r.m.deferred.Add(float64(deferred))
	if waited > 0 {
		r.m.pings.WithLabelValues("waited").Add(float64(waited))
	}
	if len(ping) > 0 {
		r.m.pings.WithLabelValues("sent").Add(float64(len(ping)))
	}
	for _, c := range ping {
		r.ping(c)
	}
	// Shoppers blocked after they joined lose their connection with BLOCKED
	// (a bounded number per tick: each close waits up to a second for the
	// error message to go out).
	for _, c := range kick {
		c.fail(errBlockedNow)
	}
	if len(expired) > 0 {
		r.requeueConns(ctx, sr, expired, now)
	}
	if len(present) > 0 {
		r.markPresent(ctx, sr.id, present, now)
	}
	if len(admit) == 0 {
		return waiting
	}
	users := make([]int64, len(admit))
	places := make([]int64, len(admit))
	for i, c := range admit {
		users[i], places[i] = c.user, c.place
	}
	at, err := admitUsers(ctx, r.rdb, sr.id, now.UnixMilli(), users, places)
	if err != nil {
		r.log.Warn("record admissions", "sale", sr.id, "err", err)
		return waiting
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	for i, c := range admit {
		if at[i] == 0 || c.admittedAt != 0 {
			continue
		}
		c.admittedAt = at[i]
		v := view{state: StateAdmitted}
		c.last = v
		c.push(v, opens, r.admittedMessage(sr, c.user, at[i]))
	}
	return waiting
}

// markPresent marks admitted connections present (admitScript, which
// writes no record for them: they have one), in calls of at most
// maxPresentPerCall users.
func (r *Room) markPresent(ctx context.Context, saleID int64, conns []heldConn, now time.Time) {
	for len(conns) > 0 {
		part := conns[:min(len(conns), maxPresentPerCall)]
		conns = conns[len(part):]
		users := make([]int64, len(part))
		places := make([]int64, len(part))
		for i, c := range part {
			users[i], places[i] = c.user, c.place
		}
		if _, err := admitUsers(ctx, r.rdb, saleID, now.UnixMilli(), users, places); err != nil {
			r.log.Warn("mark admitted shoppers present", "sale", saleID, "err", err)
			return
		}
	}
}

const maxPresentPerCall = 1000

// maxRequeuePerTick bounds the expired admissions one broadcast sends to
// the back of the queue (the rest wait for the next tick).
const maxRequeuePerTick = 1000

// requeue sends users whose admission expired unused to the back of the
// queue, as their rejoin would (the join script gives a user whose
// admission record is older than the token's life a new ticket). Users
// who bought in the sale (a buyer record in Redis) are not sent back: they
// are reported in bought, and keep their place.
func (r *Room) requeue(ctx context.Context, sr *saleRoom, users []int64, now time.Time) (tickets map[int64]int64, bought map[int64]bool, err error) {
	ids := make([]string, len(users))
	for i, u := range users {
		ids[i] = strconv.FormatInt(u, 10)
	}
	recs, err := r.rdb.HMGet(ctx, lua.BuyersKey(sr.id), ids...).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("waitroom.requeue: %w", err)
	}
	bought = map[int64]bool{}
	var again []int64
	for i, u := range users {
		if recs[i] != nil {
			bought[u] = true
		} else if !slices.Contains(again, u) {
			again = append(again, u)
		}
	}
	tickets = map[int64]int64{}
	if len(again) == 0 {
		return tickets, bought, nil
	}
	sr.mu.Lock()
	sale := sr.sale
	sr.mu.Unlock()
	_, ts, err := registerJoins(ctx, r.rdb, sale, now.UnixMilli(), r.cfg.AdmissionTTL.Milliseconds(), sr.knownNow(), again)
	if err != nil {
		return nil, nil, err
	}
	for i, u := range again {
		tickets[u] = ts[i]
	}
	return tickets, bought, nil
}

// requeueConns applies requeue to connections whose admission expired: a
// new ticket (their next status is WAITING, at the back), or, for a buyer,
// no further look.
func (r *Room) requeueConns(ctx context.Context, sr *saleRoom, conns []*conn, now time.Time) {
	users := make([]int64, len(conns))
	for i, c := range conns {
		users[i] = c.user
	}
	tickets, bought, err := r.requeue(ctx, sr, users, now)
	if err != nil {
		r.log.Warn("requeue expired admissions", "sale", sr.id, "err", err)
		return
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	for _, c := range conns {
		if bought[c.user] {
			c.bought = true
			continue
		}
		if t, ok := tickets[c.user]; ok {
			c.ticket, c.place, c.admittedAt = t, -1, 0
		}
	}
}

// dueStatus is a WAITING status due to a connection, held by broadcast
// until the tick's budget is known.
type dueStatus struct {
	c *conn
	v view
}

// Blocker is implemented by a JoinGuard that can tell, without side
// effects, whether a shopper is blocked now (*defense.Guard does).
type Blocker interface {
	Blocked(ip netip.Addr, userID int64) bool
}

const maxKicksPerTick = 64

var errBlockedNow = &flashsale.Error{Code: flashsale.CodeBlocked, Message: "access blocked"}

// resumeHeld is the sold-out state to show given the stock's: a sale that
// was sold out stays so until stock has been back for ResumeDelay. Called
// with sr.mu held.
func (r *Room) resumeHeld(sr *saleRoom, soldOut bool, now time.Time) bool {
	switch {
	case r.cfg.ResumeDelay < 0:
		return soldOut
	case soldOut:
		sr.availableSince = time.Time{}
		return true
	case !sr.soldOut:
		return false
	case sr.availableSince.IsZero():
		sr.availableSince = now
	}
	if now.Sub(sr.availableSince) < r.cfg.ResumeDelay {
		return true
	}
	sr.availableSince = time.Time{}
	return false
}

func (r *Room) expiry(admittedAtMs int64) time.Time {
	return time.UnixMilli(admittedAtMs).Add(r.cfg.AdmissionTTL)
}

func (r *Room) token(saleID, userID, admittedAtMs int64) (string, time.Time) {
	exp := r.expiry(admittedAtMs)
	return r.signer.Sign(flashsale.Admission{UserID: userID, SaleID: saleID, ExpiresAt: exp}), exp
}

// admittedMessage encodes the "admitted" message. Called with sr.mu held.
func (r *Room) admittedMessage(sr *saleRoom, userID, admittedAtMs int64) []byte {
	tok, exp := r.token(sr.id, userID, admittedAtMs)
	return appendAdmitted(make([]byte, 0, 64+len(tok)+len(sr.itemsJS)), tok, exp.UnixMilli(), sr.itemsJS)
}

// Join batching.

type joinReq struct {
	sale *flashsale.Sale
	user int64
	done chan joinRes
}

type joinRes struct {
	ticket int64
	st     queueState
	err    error
}

var errStopped = errors.New("waitroom: room is not running")

// batcher collects joins for up to JoinBatchWindow (or MaxJoinBatch joins)
// and registers each batch with one script call per sale. Up to 4 batches
// are in flight.
func (r *Room) batcher(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, 4)
	for {
		var batch []*joinReq
		select {
		case <-ctx.Done():
			r.drainJoins()
			return
		case q := <-r.joins:
			batch = append(batch, q)
		}
		timer := time.NewTimer(r.cfg.JoinBatchWindow)
	collect:
		for len(batch) < r.cfg.MaxJoinBatch {
			select {
			case q := <-r.joins:
				batch = append(batch, q)
			case <-timer.C:
				break collect
			case <-ctx.Done():
				break collect
			}
		}
		timer.Stop()
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			for _, q := range batch {
				q.done <- joinRes{err: errStopped}
			}
			r.drainJoins()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			r.flushJoins(ctx, batch)
		})
	}
}

func (r *Room) drainJoins() {
	for {
		select {
		case q := <-r.joins:
			q.done <- joinRes{err: errStopped}
		default:
			return
		}
	}
}

func (r *Room) flushJoins(ctx context.Context, batch []*joinReq) {
	bySale := map[int64][]*joinReq{}
	var order []int64
	for _, q := range batch {
		if bySale[q.sale.ID] == nil {
			order = append(order, q.sale.ID)
		}
		bySale[q.sale.ID] = append(bySale[q.sale.ID], q)
	}
	now := r.cfg.Now()
	for _, id := range order {
		qs := bySale[id]
		users := make([]int64, len(qs))
		for i, q := range qs {
			users[i] = q.user
		}
		sr := r.saleRoom(id, true)
		r.firstCheck(ctx, sr)
		st, tickets, err := registerJoins(ctx, r.rdb, qs[0].sale, now.UnixMilli(), r.cfg.AdmissionTTL.Milliseconds(), sr.knownNow(), users)
		if errors.Is(err, errStale) {
			// Redis lost the queue (or holds an older one): rebuild it,
			// then register the batch in the rebuilt queue.
			if err = r.restoreSale(ctx, id); err == nil {
				st, tickets, err = registerJoins(ctx, r.rdb, qs[0].sale, now.UnixMilli(), r.cfg.AdmissionTTL.Milliseconds(), sr.knownNow(), users)
			}
		}
		for i, q := range qs {
			if err != nil {
				q.done <- joinRes{err: err}
				continue
			}
			q.done <- joinRes{ticket: tickets[i], st: st}
		}
	}
}

// register puts the user in the sale's queue (one batched script call) and
// returns the ticket and the sale room, loaded.
func (r *Room) register(ctx context.Context, sale *flashsale.Sale, userID int64) (int64, *saleRoom, error) {
	sr := r.saleRoom(sale.ID, true)
	r.mu.Lock()
	reg := sr.registered
	sr.registered = true
	r.mu.Unlock()
	if !reg {
		if err := r.rdb.SAdd(ctx, activeKey, sale.ID).Err(); err != nil {
			r.mu.Lock()
			sr.registered = false
			r.mu.Unlock()
			return 0, nil, fmt.Errorf("waitroom.register: %w", err)
		}
	}
	q := &joinReq{sale: sale, user: userID, done: make(chan joinRes, 1)}
	select {
	case r.joins <- q:
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
	var res joinRes
	select {
	case res = <-q.done:
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
	if res.err != nil {
		return 0, nil, res.err
	}
	r.m.joined.Inc()
	if err := r.ensureLoaded(ctx, sr, res.st); err != nil {
		return 0, nil, err
	}
	return res.ticket, sr, nil
}

// ensureLoaded makes sure the sale room has read the sale's state once,
// then folds st in.
func (r *Room) ensureLoaded(ctx context.Context, sr *saleRoom, st queueState) error {
	sr.mu.Lock()
	loaded := sr.loaded
	sr.touched = r.cfg.Now()
	sr.mu.Unlock()
	if !loaded {
		if _, err := r.refresh(ctx, sr.id, r.cfg.Now()); err != nil {
			return err
		}
	}
	sr.mu.Lock()
	sr.observe(st)
	sr.mu.Unlock()
	return nil
}

func notFound() error { return flashsale.Errorf(flashsale.CodeNotFound, "no such sale") }

// Join puts the caller in the sale's queue (the polling POST) and returns
// the status. A challenge from the JoinGuard comes back as a Status with
// Type "challenge" (and no error); the caller solves it and joins again
// with pow. Errors are *flashsale.Error (NOT_FOUND, BLOCKED, RATE_LIMITED)
// or internal.
func (r *Room) Join(ctx context.Context, p flashsale.Principal, saleID int64, ip netip.Addr, pow json.RawMessage) (Status, error) {
	sale, ok := r.sales.Sale(saleID)
	if !ok {
		return Status{}, notFound()
	}
	if r.guard != nil {
		ch, err := r.guard.CheckJoin(ctx, ip, p.UserID, saleID, pow)
		if err != nil {
			return Status{}, err
		}
		if ch != nil {
			return Status{Type: TypeChallenge, Challenge: ch}, nil
		}
	}
	ticket, sr, err := r.register(ctx, sale, p.UserID)
	if err != nil {
		return Status{}, err
	}
	return r.pollStatus(ctx, sr, p.UserID, ticket)
}

// Status is the caller's current status (the polling GET), with the
// admission token once admitted. A caller who has not joined gets
// NOT_FOUND.
func (r *Room) Status(ctx context.Context, p flashsale.Principal, saleID int64) (Status, error) {
	if _, ok := r.sales.Sale(saleID); !ok {
		return Status{}, notFound()
	}
	// Loaded first: a gateway's first look at a sale may find the queue
	// lost from Redis and restore it (refresh), and the ticket with it.
	sr := r.saleRoom(saleID, true)
	if err := r.ensureLoaded(ctx, sr, queueState{N: -1}); err != nil {
		return Status{}, err
	}
	ticket, err := r.rdb.HGet(ctx, lua.QueueKey(saleID, keyTickets), strconv.FormatInt(p.UserID, 10)).Int64()
	if errors.Is(err, redis.Nil) {
		return Status{}, flashsale.Errorf(flashsale.CodeNotFound, "not in this sale's queue; join first")
	}
	if err != nil {
		return Status{}, fmt.Errorf("waitroom.Status: %w", err)
	}
	return r.pollStatus(ctx, sr, p.UserID, ticket)
}

// pollStatus builds the polling answer for one user.
func (r *Room) pollStatus(ctx context.Context, sr *saleRoom, userID, ticket int64) (Status, error) {
	now := r.cfg.Now()
	sr.mu.Lock()
	place, ok := sr.place(ticket)
	if !ok {
		place = -1
	}
	v := sr.viewOf(place, now)
	sale := sr.sale
	items := sr.items
	sr.mu.Unlock()
	st := Status{Type: TypeStatus, State: v.state, ServerTimeMs: now.UnixMilli(), OpensAtMs: sale.StartsAt.UnixMilli(),
		Position: v.position, EtaSeconds: v.eta}
	if v.state != StateAdmitted {
		return st, nil
	}
	at, err := admitUsers(ctx, r.rdb, sr.id, now.UnixMilli(), []int64{userID}, []int64{place})
	if err != nil {
		return Status{}, err
	}
	if at[0] == 0 { // the cursor in Redis is behind our view: not yet
		st.State, st.Position = StateWaiting, 0
		return st, nil
	}
	if now.UnixMilli() >= at[0]+r.cfg.AdmissionTTL.Milliseconds() {
		// The admission expired unused: to the back of the queue.
		tickets, _, err := r.requeue(ctx, sr, []int64{userID}, now)
		if err != nil {
			return Status{}, err
		}
		if t, ok := tickets[userID]; ok {
			return r.pollStatus(ctx, sr, userID, t)
		}
	}
	tok, exp := r.token(sr.id, userID, at[0])
	st.AdmissionToken, st.ExpiresAtMs, st.Items = tok, exp.UnixMilli(), items
	return st, nil
}

// Figures are the sale's queue figures, shared by every gateway: joined
// (distinct shoppers with a ticket), admitted (places the cursor passed)
// and waiting (tickets not yet admitted).
func (r *Room) Figures(ctx context.Context, saleID int64) (flashsale.QueueFigures, error) {
	pipe := r.rdb.Pipeline()
	joined := pipe.HLen(ctx, lua.QueueKey(saleID, keyTickets))
	st := pipe.HMGet(ctx, lua.QueueKey(saleID, keyState), fieldSeq, fieldServing)
	if _, err := pipe.Exec(ctx); err != nil {
		return flashsale.QueueFigures{}, fmt.Errorf("waitroom.Figures: %w", err)
	}
	vals := st.Val()
	seq, serving := toInt(vals[0]), toInt(vals[1])
	return flashsale.QueueFigures{Joined: joined.Val(), Admitted: serving, Waiting: max(0, seq-serving)}, nil
}
