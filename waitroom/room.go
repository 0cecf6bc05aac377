// Package waitroom is the virtual queue in front of a flash sale: shoppers
// join over a WebSocket (or by polling), get a place, see their position and
// an ETA, and receive an admission token when their turn comes.
//
// The queue lives in Redis so that any number of gateways share it (keys in
// store.go). Joins are collected for up to 20 ms and registered with
// one script call per batch and sale. Each gateway runs one tick loop: per
// tick and sale it reads the stock (StockSource) and runs one script that
// also lets the leader (a Redis lease) advance the shared "now serving"
// cursor at the sale's admission rate, capped by the remaining stock. Every
// gateway then computes the position of each of its own connections in
// memory and pushes a status to those whose view changed. Places before the
// opening are ordered by a published draw (draw.go, docs/DRAW.md). A sale
// allocated in queue order admits by units held at each shopper's turn
// instead of the rate and the cap (allocate.go).
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
// The report after the drop: each gateway counts what its room sees of a
// sale per minute (queue readings, held turns, refused joins, waits from
// join to admission) in memory, with no Redis work of its own, and writes
// its figures to PostgreSQL every Config.ReportEvery and when it stops
// (report.go); the operator API reads them summed over the gateways.
//
// Blocking rules: Join and Status block for at most one join batch and a few
// Redis round trips (bounded by ctx). ServeHTTP returns once the upgrade
// is answered: the handshake runs on a kept goroutine, and a joined
// WebSocket then waits in the room's poller with no goroutine of its own
// (idle.go). Writes to WebSockets are done by a small pool of writers with
// a write timeout; a slow client is dropped, never waited on by the tick.
//
// It imports internal/conn/gopool, the connection plumbing's pool of kept
// goroutines, for each connection's handshake, each ping and each read of
// a joined connection, and internal/conn/idlepoll, which says when a
// joined connection has bytes to read.
package waitroom

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/admission"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/conn/gopool"
	"github.com/flashsale/flashsale/internal/conn/idlepoll"
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

// Blocker is implemented by a JoinGuard that can tell, without side
// effects, whether a shopper is blocked now (*defense.Guard does).
// BlocksGen changes whenever an answer of Blocked may have: until it
// does, a connection found not blocked need not be asked about again.
type Blocker interface {
	Blocked(ip netip.Addr, userID int64) bool
	BlocksGen() uint64
}

// Room is the waiting room of every sale, on one gateway.
type Room struct {
	cfg   Config
	rdb   redis.UniversalClient
	sales SaleSource
	stock StockSource
	// reservations answers what the queue needs of the stock's
	// reservation records (the counters and buyer records of every stock
	// shard): the stock adapter names those keys, on the Redis the
	// queue's scripts read shard 0's from, rdb.
	reservations *redisstock.Store
	access       AccessVerifier
	signer       *admission.Signer
	guard        JoinGuard
	log          *slog.Logger
	m            *metrics
	tally        *tally // the report's figures not yet written
	id           string // leader lease owner id
	// restores numbers this gateway's restores (their epochs).
	restores atomic.Int64

	joins chan *joinReq
	// drawn wakes the checkpoint loop when this gateway, leading, sees a
	// sale's draw: the pre-queue's membership goes to Durable at once.
	drawn chan struct{}

	mu       sync.Mutex
	rooms    map[int64]*saleRoom
	perIP    map[netip.Addr]int
	total    int // WebSocket connections of this process (MaxConns)
	perUser  map[int64]int
	conns    map[*conn]struct{}
	closing  bool
	connSeq  uint64
	handlers sync.WaitGroup
	pings    sync.WaitGroup
	// work runs each connection's handshake and each ping on a goroutine
	// kept from one to the next (its stack grown already); closed when
	// the room stops (Run's end, Shutdown). handlers and pings count the
	// work itself.
	work *gopool.Pool
	// idle is the poller joined connections wait in (idle.go): started at
	// the first, closed by Shutdown once every connection is done.
	idleMu    sync.Mutex
	idle      *idlepoll.Poller
	idleTried bool
	tickCount uint64
	// Config.Competing at the last regular tick, and its rise over the
	// tick before (tick loop only).
	competing, competingDelta int64

	sendMu   sync.Mutex
	sendCond *sync.Cond
	sendHi   []*conn // connections with an admission message: written first
	sendQ    []*conn
	sendStop bool
	// writing is what each writer is sending (ws.go, writeSlot), which
	// writeWatch reads to drop a client past WriteTimeout; started is the
	// base of their monotonic times.
	writing []writeSlot
	started time.Time
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
		cfg: cfg, rdb: rdb, sales: sales, stock: stock, reservations: redisstock.New(rdb),
		access: access, signer: signer, guard: guard,
		log: logger, m: m, tally: newTally(), id: hex.EncodeToString(idb[:]),
		joins:   make(chan *joinReq, 4*cfg.MaxJoinBatch),
		drawn:   make(chan struct{}, 1),
		rooms:   map[int64]*saleRoom{},
		perIP:   map[netip.Addr]int{},
		perUser: map[int64]int{},
		conns:   map[*conn]struct{}{},
		work:    gopool.New(workIdle),
		writing: make([]writeSlot, cfg.Writers),
		started: time.Now(),
	}
	r.sendCond = sync.NewCond(&r.sendMu)
	return r
}

// workIdle is how long a goroutine of Room.work waits for the next
// handshake or ping before it ends.
const workIdle = 10 * time.Second

// Run registers join batches, pushes statuses and advances the queues of
// the sales this gateway leads until ctx ends; then it returns nil.
func (r *Room) Run(ctx context.Context) error {
	if err := loadScripts(ctx, r.rdb); err != nil && ctx.Err() == nil {
		r.log.Warn("load scripts", "err", err) // Script.Run falls back to EVAL
	}
	r.sendMu.Lock()
	r.sendStop = false
	r.sendMu.Unlock()
	var wg, writers sync.WaitGroup
	for i := range r.writing {
		writers.Go(func() { r.writer(&r.writing[i]) })
	}
	// The watch outlives the writers: a writer stuck in a slow client's
	// write at the end is released by it.
	writersDone := make(chan struct{})
	wg.Go(func() { r.writeWatch(writersDone) })
	wg.Go(func() { r.batcher(ctx) })
	wg.Go(func() { r.advanceLoop(ctx) })
	wg.Go(func() { r.checkpointLoop(ctx) })
	wg.Go(func() { r.reportLoop(ctx) })
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
			writers.Wait()
			close(writersDone)
			wg.Wait()
			r.work.Close()
			// The last figures, once nothing counts any more.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			r.flushReport(fctx)
			cancel()
			return nil
		case <-t.C:
			regular = true
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

// Figures are the sale's queue figures, shared by every gateway: joined
// (distinct shoppers with a ticket), admitted (places the cursor passed)
// and waiting (tickets not yet admitted).
func (r *Room) Figures(ctx context.Context, saleID int64) (_ flashsale.QueueFigures, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
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
