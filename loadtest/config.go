// Package loadtest is the flash-sale load harness: it drives a running
// flashsale stack from outside, through the public interface only
// (CONTRACT.md sections 3–5), with simulated shoppers and hostile traffic,
// and reports outcomes, latencies and the invariant checks.
//
// A run: create a sale (or use a given one), a hostile-only phase before
// opening (counting Redis commands when Redis is given), shoppers who
// join the waiting room (WebSocket or polling), wait for admission, buy,
// wait for the order to become payable and pay with probability
// PayFraction, then a wait until the system is quiet, the read-back of
// every order and the invariant checks. Run returns an error when an
// invariant is broken.
//
// Shoppers act as the shop page does when a part fails: a room
// connection that drops or cannot be opened is tried again after a
// jittered, capped backoff with the same access token; after a transport
// error (refused, reset, broken, no answer) the shopper moves to the next
// gateway of the run; a purchase whose answer was lost (a transport
// error, a 5xx, a 503 naming an order) is looked up with GET
// /api/flash-sales/sales/{id}/order before buying again, after the
// Retry-After of a 429 or 503.
//
// The JSON report's fault-tolerance parts, whose names stay stable (the
// fault suite reads them):
//
//   - "ledger": every order the run learnt of: orderId, userId, itemId,
//     gateway (base URL of the answer), source (purchase_202,
//     purchase_409, sale_order, purchase_503), acknowledged (a 202),
//     atMs (since the opening) and atUnixMs, shopperStatus, apiStatus
//     (GET of the order as its owner at the end: a status, NOT_FOUND or
//     UNREAD <outcome>), dbStatus (its PostgreSQL row, ABSENT without one;
//     DatabaseURL runs), final (the row's status, else the API's;
//     MISSING, UNKNOWN).
//   - "summary": oversold, acknowledged, acknowledgedLost,
//     acknowledgedRejected, acknowledgedCancelled (not by its shopper),
//     acknowledgedUnverified, acknowledgedInFlight, ordersBySource,
//     unacknowledgedRejected, strandedUnits (remainingUnits when the run
//     ended with the sale open and shoppers waiting: waitingAdmin from
//     the admin API's queue.waiting, waitingRun from the run's own
//     shoppers), saleState, http5xx (every 5xx but a 503 with
//     Retry-After: {total, byRoute: {"purchase 500": n, "pay 503 without
//     Retry-After": n}}), http503RetryAfter, networkErrors ({total,
//     byRoute: {"purchase conn_refused": n}}), reconnects, gatewayMoves,
//     placesLost, examples (up to 10 order ids per broken count).
//   - "timeline": admissionsMs and reservationsMs, sorted ms since the
//     opening of every admission token a shopper received and of every
//     202: the recovery from a fault at T is the first of each after T.
//
// The "cpu" part: CPU-seconds (utime + stime from /proc, children reaped
// included) of each server process named in ServerPIDs, grouped by role,
// and of the load tool with its workers ("load"), over the window from the
// opening to the first 100 ms snapshot at or after the last reservation
// and over the whole run; their sums and the same per 1,000 shoppers and
// per 1,000 units sold (see CPUReport).
//
// Invariants besides oversell, one order per user and conservation:
// "acknowledged orders kept" (every 202 ends PENDING, PAID, EXPIRED or
// CANCELLED by its shopper), "no stranded stock" and "no 5xx but 503
// with Retry-After".
package loadtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/redisconn"
)

// WorkerArg is the one argument a forked worker process is started with.
// When it is the first argument, main must call RunWorker and exit with its
// result instead of doing anything else.
const WorkerArg = "-loadtest-worker"

// Transports of the waiting room.
const (
	TransportWS      = "ws"
	TransportPolling = "polling"
)

// Hostile is the hostile traffic of a run.
type Hostile struct {
	// PurchaseFlood purchases without valid tokens (none, garbage access
	// token, valid access token without or with a garbage admission token).
	PurchaseFlood int `json:"purchaseFlood,omitempty"`
	// OneAddrUsers shoppers (real users, full flow) all from one source
	// address (127.1.0.1), user ids after the regular shoppers'.
	OneAddrUsers int `json:"oneAddrUsers,omitempty"`
	// EarlyClicks purchases by valid users before the sale opens.
	EarlyClicks int `json:"earlyClicks,omitempty"`
	// Concurrency of the flood and the early clicks (0: 64).
	Concurrency int `json:"concurrency,omitempty"`
}

// Config is one load run.
type Config struct {
	Scenario  string   `json:"scenario,omitempty"` // name shown in the report
	BaseURL   string   `json:"baseUrl"`            // public address of a gateway, e.g. http://127.0.0.1:8080
	BaseURLs  []string `json:"baseUrls,omitempty"` // several gateways: shoppers are spread over them (BaseURL is added)
	AdminURL  string   `json:"adminUrl,omitempty"` // optional admin address: the run waits for GET /readyz first
	JWTSecret string   `json:"-"`                  // HS256 secret: shopper and operator tokens are minted with it

	SaleID      int64 `json:"saleId,omitempty"` // 0: create a sale
	Shoppers    int   `json:"shoppers"`
	UserBase    int64 `json:"userBase,omitempty"`    // shoppers are users UserBase+1 … UserBase+Shoppers
	Quantity    int   `json:"quantity"`              // units of a created sale, split over Items
	Items       int   `json:"items"`                 // items of a created sale
	StockShards int   `json:"stockShards,omitempty"` // stockShards of a created sale (0: the gateway's default, one)
	// Allocation and ClaimWindow of a created sale: "queue" holds a unit
	// for each shopper at their turn for the window ("" or "race": the
	// gateway's default, 0: the default window).
	Allocation    string        `json:"allocation,omitempty"`
	ClaimWindow   time.Duration `json:"claimWindow,omitempty"`
	AdmissionRate int           `json:"admissionRate"` // admissionRatePerSecond of a created sale
	StartsIn      time.Duration `json:"startsIn"`      // a created sale opens this long after the run starts
	// JoinSpread spreads the shoppers' joins evenly over this long from the
	// start of the shopper phase (0: 80% of the time left before opening,
	// at least 200 ms).
	JoinSpread time.Duration `json:"joinSpread,omitempty"`

	Transport    string        `json:"transport"`              // "ws" (default) or "polling"
	PollInterval time.Duration `json:"pollInterval,omitempty"` // polling transport (0: 1s)
	PayFraction  float64       `json:"payFraction"`            // fraction of winners who pay
	// PayAfter is a paying winner's think time from the order turning
	// payable to the pay click (each winner draws 50–150% of it from
	// Seed; 0: at once). People type card details; paying at once would
	// put every payment into the opening's busiest second.
	PayAfter time.Duration `json:"payAfter,omitempty"`
	// Reaction is a person's time from the admission (or the opening, for
	// a first-wave token) to the buy click: each shopper draws it from a
	// log-normal distribution with this median and a spread of about 2×
	// either way (σ 0.5), from Seed. 0: everyone clicks at once.
	Reaction time.Duration `json:"reaction,omitempty"`
	// FastShare is the fraction of shoppers who are fast clients (scripts)
	// and click the instant their token allows, whatever Reaction says.
	FastShare float64 `json:"fastShare,omitempty"`
	// Preconnect is how many keep-alive connections each process opens per
	// source address and gateway 15 s before the opening (the
	// warm upstream pool of the load balancer in front of the gateways, or
	// a browser's preconnect), so that purchases at the opening do not each
	// open a TCP connection first. 0: none.
	Preconnect int `json:"preconnect,omitempty"`
	// Linger is how long a shopper who saw SOLD_OUT (and bought nothing)
	// stays on the sold-out page, connected, before leaving (each draws
	// 50–150% of it from Seed; 0: leaves at once). The shop page never
	// closes the room itself; people close it over time, not all in the
	// same second.
	Linger time.Duration `json:"linger,omitempty"`
	// KeepWaiting keeps shoppers who saw SOLD_OUT in the waiting room until
	// the run ends, so stock that comes back (expiry) is sold again. The
	// shopper phase then also ends once the sale has been sold out and
	// quiet for SoldOutQuiet.
	KeepWaiting bool `json:"keepWaiting,omitempty"`
	// SoldOutQuiet (with KeepWaiting) ends the shopper phase once every
	// item has had no unit left and remaining + sold = quantity (nothing
	// pending, no hold open: no unit on its way back) on every read for
	// this long (0: 10s, twice the bound in which a lost gateway's units
	// come back). Units stranded are judged after it; units that a
	// payment window's expiry gives back later are not waited for.
	SoldOutQuiet time.Duration `json:"soldOutQuiet,omitempty"`
	// UntilPaid ends the shopper phase once the admin API shows paid =
	// quantity for every item (or when Duration runs out).
	UntilPaid bool `json:"untilPaid,omitempty"`
	// DuplicateIdentities (0–1) gives every shopper an identity key (the
	// idk claim: one person) and makes this share of them a second
	// account of the shopper before them: same key, another user id. The
	// room gives a key one place (DUPLICATE_IDENTITY), so no key may end
	// with two orders ("one order per identity key (run)").
	DuplicateIdentities float64 `json:"duplicateIdentities,omitempty"`
	// ShadowShare (0–1): this share of the shoppers carry a risk claim of
	// 0.99 in their tokens, and the run turns the bot defense's shadow
	// queue on for them (shadowQueue.riskAbove 0.9; with
	// DuplicateIdentities also the identity rule, so second accounts are
	// shadowed rather than refused). The report checks that no shadowed
	// shopper is admitted or buys.
	ShadowShare float64 `json:"shadowShare,omitempty"`

	Hostile Hostile `json:"hostile"`

	SourceAddrs int `json:"sourceAddrs,omitempty"` // client sockets bind 127.0.0.2 … (0: no binding)
	Processes   int `json:"processes,omitempty"`   // worker processes for shoppers (≤1: in-process)
	// Duration bounds the shoppers and the quiet wait; the read-back of
	// the orders and the database checks then get QuietTimeout (at least
	// 5 s) more.
	Duration time.Duration `json:"duration"`
	// QuietTimeout bounds the wait for conservation after the shoppers end
	// (0: 15s, at most a fifth of Duration).
	QuietTimeout time.Duration `json:"quietTimeout,omitempty"`
	Seed         uint64        `json:"seed,omitempty"` // who pays and item choice are drawn from it

	Progress    io.Writer        `json:"-"` // live progress line (\r-updated); nil: none
	DatabaseURL string           `json:"-"` // optional: invariants straight from PostgreSQL
	Redis       redisconn.Config `json:"-"` // optional: Redis command counter around the hostile phase
	// ServerPIDs names the server processes whose CPU the report counts,
	// by role ("gateway", "redis", "postgres", …; see ParseServerPIDs):
	// each with its live children and the children it reaped. The load
	// tool and its workers are counted as RoleLoad in any case.
	ServerPIDs map[string][]int `json:"serverPids,omitempty"`
	// Profile takes CPU profiles of the opening (servers and load
	// workers); zero: none.
	Profile OpeningProfile `json:"profile,omitzero"`
	// WorkerCPUProfileDir, when set, is a directory where each worker
	// process writes a CPU profile of its whole run
	// (loadtest-worker-<pid>.pprof), to see what the load generator itself
	// costs.
	WorkerCPUProfileDir string `json:"workerCpuProfileDir,omitempty"`

	// SolvePow answers a waiting-room proof-of-work challenge (the whole
	// challenge message in, the "pow" object of the next join out). Nil:
	// the built-in solver (defense.SolvePow when available).
	SolvePow func(challenge json.RawMessage) (json.RawMessage, error) `json:"-"`
}

func (c *Config) baseURLs() []string {
	var out []string
	seen := map[string]bool{}
	for _, u := range append([]string{c.BaseURL}, c.BaseURLs...) {
		u = strings.TrimRight(u, "/")
		if u != "" && !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	return out
}

// withDefaults fills zero fields and validates.
func (c Config) withDefaults() (Config, error) {
	if len(c.baseURLs()) == 0 {
		return c, errors.New("loadtest: BaseURL is required")
	}
	if c.JWTSecret == "" {
		return c, errors.New("loadtest: JWTSecret is required")
	}
	if c.Shoppers < 0 || c.Quantity < 0 || c.Items < 0 || c.Processes < 0 || c.SourceAddrs < 0 {
		return c, errors.New("loadtest: counts must not be negative")
	}
	if c.SourceAddrs > maxSourceAddrs {
		return c, fmt.Errorf("loadtest: SourceAddrs %d: at most %d", c.SourceAddrs, maxSourceAddrs)
	}
	if c.Transport == "" {
		c.Transport = TransportWS
	}
	if c.Transport != TransportWS && c.Transport != TransportPolling {
		return c, fmt.Errorf("loadtest: Transport %q: want ws or polling", c.Transport)
	}
	if c.PayAfter < 0 || c.Preconnect < 0 || c.Linger < 0 || c.Reaction < 0 {
		return c, errors.New("loadtest: PayAfter, Preconnect, Linger and Reaction must not be negative")
	}
	if c.DuplicateIdentities < 0 || c.DuplicateIdentities >= 1 {
		return c, errors.New("loadtest: DuplicateIdentities must be from 0 to below 1")
	}
	if !(c.ShadowShare >= 0 && c.ShadowShare < 1) {
		return c, errors.New("loadtest: ShadowShare must be from 0 to below 1")
	}
	if c.FastShare < 0 || c.FastShare > 1 {
		return c, errors.New("loadtest: FastShare must be from 0 to 1")
	}
	if c.PayFraction < 0 || c.PayFraction > 1 {
		return c, fmt.Errorf("loadtest: PayFraction %v: want 0…1", c.PayFraction)
	}
	if c.SaleID == 0 {
		if c.Items == 0 {
			c.Items = 1
		}
		if c.Quantity == 0 {
			c.Quantity = 10
		}
		if c.Quantity < c.Items {
			return c, fmt.Errorf("loadtest: Quantity %d < Items %d", c.Quantity, c.Items)
		}
		if c.AdmissionRate == 0 {
			c.AdmissionRate = 2000
		}
		if c.StartsIn == 0 {
			c.StartsIn = 3 * time.Second
		}
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.Duration == 0 {
		c.Duration = 2 * time.Minute
	}
	if c.QuietTimeout == 0 {
		c.QuietTimeout = min(15*time.Second, c.Duration/5)
	}
	if c.SoldOutQuiet == 0 {
		c.SoldOutQuiet = 10 * time.Second
	}
	if c.Processes == 0 {
		c.Processes = 1
	}
	if c.Hostile.Concurrency == 0 {
		c.Hostile.Concurrency = 64
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	return c, nil
}

// Scenario returns a preset: "smoke" (tiny), "drop" (10,000 units, 100,000
// shoppers), "expiry" (60% pay; the server's payment window must be short:
// the run waits for expired stock to be sold again and ends when paid =
// quantity or Duration runs out) and "attack" (half the traffic hostile).
// The caller sets BaseURL, JWTSecret and the optional URLs.
func Scenario(name string) (Config, error) {
	c := Config{Scenario: name, Transport: TransportWS, UserBase: 1_000_000}
	switch name {
	case "smoke":
		c.Shoppers, c.Quantity, c.Items = 50, 10, 2
		c.AdmissionRate, c.StartsIn = 100, 2*time.Second
		c.PayFraction = 1
		c.Hostile = Hostile{PurchaseFlood: 50, EarlyClicks: 10, OneAddrUsers: 5}
		c.Duration = 60 * time.Second
	case "drop":
		c.Shoppers, c.Quantity, c.Items = 100_000, 10_000, 10
		// 20,000 admissions/s: the waiting room meters the crowd, the
		// capacity factor caps admitted-unused places, and the first
		// 10,000 places are admitted within half a second (the 1 s
		// sell-out goal leaves the rest for the purchases).
		c.AdmissionRate, c.StartsIn = 20_000, 30*time.Second
		c.PayFraction, c.PayAfter = 0.9, 3*time.Second
		// The losers leave over 10–30 s: leaving the moment SOLD_OUT came
		// would put 90,000 close handshakes into the seconds when the
		// winners look at their orders and pay.
		c.Linger = 20 * time.Second
		// The full drop's command raises it to 4 (with 7 gateways):
		// 7 processes × 120 addresses × 7 gateways × 4 = 23,520 warm
		// connections, one for each purchase of the first wave
		// (remaining × capacity factor 2 = 20,000, all at the opening),
		// in about 17,200 open files on each gateway and load process.
		c.Preconnect = 2
		c.SourceAddrs = 64
		// 100k WebSockets at ≤19k open files a process.
		c.Processes = 6
		c.Duration = 5 * time.Minute
	case "expiry":
		c.Shoppers, c.Quantity, c.Items = 2_000, 200, 2
		c.AdmissionRate, c.StartsIn = 500, 5*time.Second
		c.PayFraction = 0.6
		c.KeepWaiting, c.UntilPaid = true, true
		c.SourceAddrs = 8
		c.Duration = 10 * time.Minute
	case "attack":
		c.Shoppers, c.Quantity, c.Items = 10_000, 1_000, 4
		c.AdmissionRate, c.StartsIn = 2000, 15*time.Second
		c.PayFraction = 0.9
		// Half of all requests hostile: the flood and early clicks match
		// roughly the shoppers' own requests.
		c.Hostile = Hostile{PurchaseFlood: 15_000, EarlyClicks: 4_000, OneAddrUsers: 1_000, Concurrency: 128}
		c.SourceAddrs = 32
		c.Duration = 3 * time.Minute
	default:
		return Config{}, fmt.Errorf("loadtest: unknown scenario %q (want smoke, drop, expiry or attack)", name)
	}
	return c, nil
}

// ScenarioNames lists the presets of Scenario.
func ScenarioNames() []string { return []string{"smoke", "drop", "expiry", "attack"} }
