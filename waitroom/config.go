package waitroom

import (
	"net/http"
	"net/netip"
	"runtime"
	"time"

	"github.com/flashsale/flashsale"
)

// Config configures a Room. Zero values take the defaults in brackets.
type Config struct {
	AdmissionTTL time.Duration // validity of an admission token [5m]
	// Holds takes and ends the units held for shoppers of sales allocated
	// in queue order (allocate.go); nil: such sales admit nobody.
	Holds            Holds
	Tick             time.Duration // state read and status push period [250ms]
	HandshakeTimeout time.Duration // first message deadline [10s]
	IdleTimeout      time.Duration // a connection that answers no ping for this long is closed [60s]
	WriteTimeout     time.Duration // a client whose messages take longer to write is dropped (checked every quarter of it) [5s]
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
	MaxConnsPerUser int     // [4]
	CapacityFactor  float64 // admitted-unused places ≤ factor × remaining stock [2.0]
	// DrawLead is how long before a sale's opening the pre-queue closes and
	// the draw runs [0: at the opening]. At the draw the first wave
	// (remaining stock × CapacityFactor places, in drawn order) is
	// admitted with tokens valid from the opening instant, so that at the
	// opening the CPU goes to the purchases, not to admissions. The seed is
	// public from the close (DrawAt).
	DrawLead       time.Duration
	OriginPatterns []string // cross-origin pages allowed to open the WebSocket
	// JoinBatchWindow is how long joins are collected into one batch
	// [20ms]: one script call registers them all. A drop's shoppers arrive
	// a few hundred a second a gateway; at 2 ms a batch held one or two
	// of them, and each call cost Redis and the gateway its own round
	// trip. A shopper waits for the first status up to this much longer.
	JoinBatchWindow time.Duration
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
	// OpeningHold is how long from the opening WAITING shoppers get no
	// position updates and each connection's ping may wait one period
	// (never two in a row) [3s; negative: none]. The first wave's
	// purchases and the admissions are the opening's work: admissions,
	// SOLD_OUT and a shopper's entry into WAITING still go out, and the
	// positions catch up once the hold ends.
	OpeningHold time.Duration
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
	// Records keeps each sale's public draw record, built once by the
	// sale's leader at the draw (docs/DRAW.md) [nil: no record is
	// published].
	Records DrawStore
	// DrawKey keys the member secrets (MemberSecret): every gateway of a
	// deployment must share it, and nobody else may know it [nil: a fixed
	// key, for tests only].
	DrawKey []byte
	// QueueKeyTTL is how long after a sale's end its queue keys stay in
	// Redis; a gateway sets their expiry when it retires the ended sale
	// [24h; negative: never expire].
	QueueKeyTTL time.Duration
	// Notify is told, by the sale's leader only, of the shoppers it
	// admitted, once per admission: in race order the places its cursor
	// passed, in queue order the places it held a unit for (notify.go)
	// [nil: nobody is told].
	Notify Notifier
	// Turns is told, by the sale's leader only, of the same turns as
	// Notify, with their places and how they came: the shop's webhook
	// (notify.go) [nil: nobody is told].
	Turns TurnLog
	// Report keeps the report's roll-up: what this gateway's room saw of
	// each sale, per minute (report.go) [nil: nothing is kept].
	Report *PGReport
	// ReportEvery is how often the roll-up is written; it is written once
	// more when the room stops [5s].
	ReportEvery time.Duration
	// Now is the clock [time.Now].
	Now func() time.Time
	// Gate checks each join against the sale's access rule (nil: every
	// sale is open).
	Gate Gate
	// ClientIP returns the client address of a WebSocket request [the
	// address of RemoteAddr].
	ClientIP func(*http.Request) netip.Addr
}

// DefaultMaxConnsPerIP is how many room connections one client address (an
// IPv4 address, or an IPv6 /64) may hold on one gateway unless Config.MaxConnsPerIP says otherwise
// (FLASHSALE_WS_MAX_CONNS_PER_ADDR); the load harness warns a run that
// would pass it.
const DefaultMaxConnsPerIP = 200

// DefaultAdmittedGrace is Config.AdmittedGrace's default
// (FLASHSALE_ADMITTED_GRACE).
const DefaultAdmittedGrace = 20 * time.Second

// DefaultQueueKeyTTL is Config.QueueKeyTTL's default
// (FLASHSALE_QUEUE_KEY_TTL).
const DefaultQueueKeyTTL = 24 * time.Hour

// DefaultOpeningHold is Config.OpeningHold's default
// (FLASHSALE_OPENING_HOLD).
const DefaultOpeningHold = 3 * time.Second

// beatEvery is how often a gateway marks its admitted shoppers present: a
// quarter of the grace, so a live shopper is never taken for gone.
func (c *Config) beatEvery() time.Duration { return max(c.Tick, c.AdmittedGrace/4) }

// pingSlots is the ping period in ticks: half the idle timeout, so that a
// connection answers within it or is closed.
func (c *Config) pingSlots() uint64 { return uint64(max(1, c.IdleTimeout/2/c.Tick)) }

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
	setDur(&c.JoinBatchWindow, 20*time.Millisecond)
	if c.QueueKeyTTL == 0 {
		c.QueueKeyTTL = DefaultQueueKeyTTL
	}
	if len(c.DrawKey) == 0 {
		c.DrawKey = []byte("flashsale test draw key")
	}
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
	c.DrawLead = max(0, c.DrawLead)
	if c.MaxJoinBatch <= 0 {
		c.MaxJoinBatch = 1000
	}
	if c.Writers <= 0 {
		c.Writers = 8 * runtime.GOMAXPROCS(0)
	}
	setDur(&c.StatusEvery, 2*time.Second)
	if c.OpeningHold == 0 {
		c.OpeningHold = DefaultOpeningHold
	}
	if c.AdmittedGrace == 0 {
		c.AdmittedGrace = DefaultAdmittedGrace
	}
	setDur(&c.CheckpointEvery, time.Second)
	setDur(&c.ReportEvery, 5*time.Second)
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

// DrawAt is the instant the sale's pre-queue closes and its draw runs: lead
// before the opening. Joins from then on queue first come, first served
// behind the pre-queue, and the seed may be revealed.
func DrawAt(sale *flashsale.Sale, lead time.Duration) time.Time {
	return sale.StartsAt.Add(-max(0, lead))
}
