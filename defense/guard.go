package defense

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/prom"
	"github.com/flashsale/flashsale/lua"
)

// GuardConfig configures a Guard. Zero values take the documented defaults.
type GuardConfig struct {
	// TrustedProxies are the peers whose X-Forwarded-For is believed.
	TrustedProxies []netip.Prefix
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// MaxKeys bounds the buckets each rate-limit rule (per IP, per prefix,
	// per user) keeps in memory; 0: 100000 (~200 B each).
	MaxKeys int
	// IdleEvict is how long an unused bucket is kept; 0: 1 minute. Keep it
	// above burst/rps of every limit, so an evicted bucket would have been
	// full anyway.
	IdleEvict time.Duration
	// PowKey is the HMAC key of proof-of-work challenges, the same on every
	// gateway; empty: a random key (only right for a single gateway).
	PowKey []byte
	// PowTTL is how long a challenge may be solved; 0: DefaultPowTTL.
	PowTTL time.Duration
	// PollInterval is how often Run checks the stored settings version
	// (the fallback for a lost pub/sub message); 0: 1 second.
	PollInterval time.Duration
	// ShareInterval is how often Run publishes on Redis what this
	// gateway's rate-limit buckets spent, for the other gateways to take
	// off theirs, so that the limits hold across the fleet (fleet.go);
	// 0: no sharing, each gateway limits on its own.
	ShareInterval time.Duration
	// GatewayID names this gateway in the fleet's figures (Counters); it
	// must differ between gateways. Empty: the host name and a random
	// suffix.
	GatewayID string
}

// Counter is the number of decisions of one rule with one outcome: the sum
// over the live gateways, and per gateway id in Gateways (absent without
// Redis).
type Counter struct {
	Rule     string            `json:"rule"`
	Outcome  string            `json:"outcome"`
	Count    uint64            `json:"count"`
	Gateways map[string]uint64 `json:"gateways,omitempty"`
}

// Guard enforces the settings on one gateway, in memory. It is safe for
// concurrent use; settings are swapped atomically.
type Guard struct {
	cfg    GuardConfig
	now    func() time.Time
	rdb    redis.UniversalClient
	logger *slog.Logger

	cur atomic.Pointer[compiled]
	gen atomic.Uint64

	classMu  sync.Mutex
	classIDs map[string]uint8 // grows only, so a class keeps its buckets across changes

	ips      *limiterMap[addrKey]
	prefixes *limiterMap[addrKey]
	users    *limiterMap[userKey]

	counts [numRules][numOutcomes]atomic.Uint64

	id       string                    // names the gateway in fleet figures
	instance string                    // tells this process's spend messages from the others'
	fleet    atomic.Pointer[fleetView] // the other gateways' figures, as last read
	spendW   spendWriter               // used by runShare only
}

type addrKey struct {
	cls uint8
	a   netip.Addr
}

type userKey struct {
	cls uint8
	id  int64
}

func hashAddrKey(k addrKey) uint64 {
	b := k.a.As16()
	hi := binary.LittleEndian.Uint64(b[:8])
	lo := binary.LittleEndian.Uint64(b[8:])
	return mix64(hi ^ mix64(lo^uint64(k.cls)))
}

func hashUserKey(k userKey) uint64 { return mix64(uint64(k.id) ^ uint64(k.cls)<<56) }

// rule and outcome indexes for counters.
const (
	rBlocklist = iota
	rPerIP
	rPerPrefix
	rPerUser
	rPow
	numRules
)

const (
	oAllowed = iota
	oLimited
	oBlocked
	oChallenged
	oShadow
	oShadowQueue
	numOutcomes
)

var outcomeNames = [numOutcomes]string{OutcomeAllowed, OutcomeLimited, OutcomeBlocked, OutcomeChallenged, OutcomeShadow, OutcomeShadowQueue}

// ruleOutcomes are the outcomes each rule can have (Counters reports these).
var ruleOutcomes = [numRules][]int{
	rBlocklist: {oAllowed, oBlocked, oShadow, oShadowQueue},
	rPerIP:     {oAllowed, oLimited, oShadow},
	rPerPrefix: {oAllowed, oLimited, oShadow},
	rPerUser:   {oAllowed, oLimited, oShadow},
	rPow:       {oAllowed, oChallenged, oShadow, oShadowQueue},
}

// Shared refusals: returning them allocates nothing, so a flood of refused
// requests is cheap. Callers must not modify them.
var (
	errBlocked     = &flashsale.Error{Code: flashsale.CodeBlocked, Message: "access blocked"}
	errRateLimited = &flashsale.Error{Code: flashsale.CodeRateLimited, Message: "too many requests, retry later"}
	errUnavailable = &flashsale.Error{Code: flashsale.CodeUnavailable, Message: "try again shortly"}
)

// compiled is an immutable, lookup-ready form of Settings.
type compiled struct {
	st      Settings
	gen     uint64
	def     classRules
	classes map[string]*classRules
	shadow  [numRules]bool

	blockBits  []prefixLen // distinct prefix lengths in blockNets
	blockNets  map[netip.Prefix]struct{}
	blockUsers map[int64]struct{}

	powDifficulty uint64
}

// classRules is the limit and bucket namespace of each rule for one class.
type prefixLen struct {
	bits int
	v6   bool
}

type classRules struct {
	ip, prefix, user limitRule
}

type limitRule struct {
	cls uint8
	l   Limit
}

// NewGuard returns a Guard enforcing DefaultSettings until Apply or Run
// loads others. rdb is used only for proof-of-work single use; logger and
// reg may be nil.
func NewGuard(cfg GuardConfig, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) *Guard {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 100_000
	}
	if cfg.IdleEvict <= 0 {
		cfg.IdleEvict = time.Minute
	}
	if cfg.PowTTL <= 0 {
		cfg.PowTTL = DefaultPowTTL
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "defense")
	if cfg.GatewayID == "" || len(cfg.GatewayID) > maxIDLen {
		cfg.GatewayID = defaultGatewayID()
	}
	share := cfg.ShareInterval > 0 && rdb != nil
	if len(cfg.PowKey) == 0 {
		cfg.PowKey = make([]byte, 32)
		rand.Read(cfg.PowKey) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24+)
		logger.Warn("no proof-of-work key configured: using a random one; challenges will not verify on other gateways")
	}
	g := &Guard{
		cfg:      cfg,
		now:      cfg.Now,
		rdb:      rdb,
		logger:   logger,
		classIDs: map[string]uint8{},
		ips:      newLimiterMap(cfg.MaxKeys, hashAddrKey, share),
		prefixes: newLimiterMap(cfg.MaxKeys, hashAddrKey, share),
		users:    newLimiterMap(cfg.MaxKeys, hashUserKey, share),
		id:       cfg.GatewayID,
		instance: newInstanceID(),
	}
	g.Apply(DefaultSettings())
	if _, err := prom.Register(reg, &guardCollector{g: g}); err != nil {
		logger.Error("guard metrics not exported", "err", err)
	}
	return g
}

// Apply makes st the enforced settings at once (an atomic swap). Buckets
// are kept and take the new limits on their next use. Invalid settings are
// logged and ignored.
func (g *Guard) Apply(st Settings) {
	st = st.clone()
	if err := st.normalize(); err != nil {
		g.logger.Error("settings not applied", "err", err, "version", st.Version)
		return
	}
	c := &compiled{
		st:            st,
		gen:           g.gen.Add(1),
		classes:       make(map[string]*classRules, len(st.RateLimit.Classes)),
		blockNets:     make(map[netip.Prefix]struct{}, len(st.Blocklist.CIDRs)),
		blockUsers:    make(map[int64]struct{}, len(st.Blocklist.Users)),
		powDifficulty: st.Pow.Difficulty,
	}
	rl := st.RateLimit
	c.def = classRules{ip: limitRule{l: rl.PerIP}, prefix: limitRule{l: rl.PerPrefix}, user: limitRule{l: rl.PerUser}}
	classes := rl.Classes
	if _, ok := classes[ClassDraw]; !ok {
		// The draw record has its own buckets even when the settings name
		// none: it is large and never changes, so a client needs it once.
		classes = maps.Clone(classes)
		if classes == nil {
			classes = map[string]ClassLimits{}
		}
		l := DefaultDrawPerIP()
		classes[ClassDraw] = ClassLimits{PerIP: &l}
	}
	for name, cl := range classes {
		id, ok := g.classID(name)
		if !ok {
			g.logger.Warn("too many route classes over time; class shares the default buckets", "class", name)
		}
		cr := c.def
		if cl.PerIP != nil {
			cr.ip = limitRule{cls: id, l: *cl.PerIP}
		}
		if cl.PerPrefix != nil {
			cr.prefix = limitRule{cls: id, l: *cl.PerPrefix}
		}
		if cl.PerUser != nil {
			cr.user = limitRule{cls: id, l: *cl.PerUser}
		}
		c.classes[name] = &cr
	}
	lens := map[prefixLen]bool{}
	for _, s := range st.Blocklist.CIDRs {
		p, err := parsePrefix(s)
		if err != nil { // normalize checked them
			continue
		}
		c.blockNets[p] = struct{}{}
		lens[prefixLen{p.Bits(), p.Addr().Is6()}] = true
	}
	for l := range lens {
		c.blockBits = append(c.blockBits, l)
	}
	for _, s := range st.Blocklist.Users {
		id, err := strconv.ParseInt(s, 10, 64)
		if err == nil {
			c.blockUsers[id] = struct{}{}
		}
	}
	for i, r := range ruleNames { // ruleNames is in rule-index order
		c.shadow[i] = st.Shadow[r]
	}
	g.cur.Store(c)
}

// classID returns the stable bucket namespace of a class (1..255).
func (g *Guard) classID(name string) (uint8, bool) {
	g.classMu.Lock()
	defer g.classMu.Unlock()
	if id, ok := g.classIDs[name]; ok {
		return id, true
	}
	if len(g.classIDs) >= 255 {
		return 0, false
	}
	id := uint8(len(g.classIDs) + 1)
	g.classIDs[name] = id
	return id, true
}

// Blocked reports whether the blocklist, enforced (not in shadow mode),
// refuses this address or user now. It counts nothing: the waiting room
// calls it on every tick to close the connections of shoppers blocked after
// they joined.
func (g *Guard) Blocked(ip netip.Addr, userID int64) bool {
	c := g.cur.Load()
	if c.shadow[rBlocklist] || c.st.ShadowQueue.Rules[ShadowBlocklist] {
		return false
	}
	return c.addrBlocked(ip) || c.userBlocked(userID)
}

// BlocksGen is the generation of the enforced settings, which changes
// with every Apply: Blocked answers the same until it does
// (waitroom.Blocker).
func (g *Guard) BlocksGen() uint64 { return g.cur.Load().gen }

// Shadows reports whether a join that rule (ShadowQueue.Rules) would
// refuse goes to the shadow queue instead (waitroom.Shadower).
func (g *Guard) Shadows(rule string) bool { return g.cur.Load().st.ShadowQueue.Rules[rule] }

// ShadowRisk is the risk claim above which a join is shadowed (0: off).
func (g *Guard) ShadowRisk() float64 { return g.cur.Load().st.ShadowQueue.RiskAbove }

// Settings returns the settings being enforced.
func (g *Guard) Settings() Settings { return g.cur.Load().st.clone() }

// ClientAddr is ClientAddr with the Guard's trusted proxies.
func (g *Guard) ClientAddr(peer netip.Addr, xff string) netip.Addr {
	return ClientAddr(peer, xff, g.cfg.TrustedProxies)
}

func (c *compiled) rulesFor(class string) *classRules {
	if len(c.classes) != 0 {
		if r, ok := c.classes[class]; ok {
			return r
		}
	}
	return &c.def
}

// CheckAddr applies, before authentication and without I/O, the CIDR
// blocklist (BLOCKED) and the per-address and per-prefix limits of the route
// class (RATE_LIMITED with the time after which a retry can succeed). ip
// should come from ClientAddr. It allocates nothing.
func (g *Guard) CheckAddr(ip netip.Addr, class string) (time.Duration, error) {
	return g.CheckAddrAt(ip, class, g.now())
}

// CheckAddrAt is CheckAddr at the caller's clock reading now (a gateway
// reads the time once per request and reuses it).
func (g *Guard) CheckAddrAt(ip netip.Addr, class string, now time.Time) (time.Duration, error) {
	c := g.cur.Load()
	ip = normAddr(ip)
	if err := g.blocklist(c, c.addrBlocked(ip)); err != nil {
		return 0, err
	}
	r := c.rulesFor(class)
	if r.ip.l.Enabled() {
		if d, err := g.limited(c, rPerIP, g.ips.allow(addrKey{r.ip.cls, ip}, r.ip.l, c.gen, now)); err != nil {
			return d, err
		}
	}
	if r.prefix.l.Enabled() {
		if p, ok := addrPrefix(ip); ok {
			if d, err := g.limited(c, rPerPrefix, g.prefixes.allow(addrKey{r.prefix.cls, p}, r.prefix.l, c.gen, now)); err != nil {
				return d, err
			}
		}
	}
	return 0, nil
}

// CheckUser applies, after authentication and without I/O, the user
// blocklist (BLOCKED) and the per-user limit of the route class
// (RATE_LIMITED with a retry delay). It allocates nothing.
func (g *Guard) CheckUser(userID int64, class string) (time.Duration, error) {
	return g.CheckUserAt(userID, class, g.now())
}

// CheckUserAt is CheckUser at the caller's clock reading now.
func (g *Guard) CheckUserAt(userID int64, class string, now time.Time) (time.Duration, error) {
	c := g.cur.Load()
	if err := g.blocklist(c, c.userBlocked(userID)); err != nil {
		return 0, err
	}
	r := c.rulesFor(class)
	if r.user.l.Enabled() {
		return g.limited(c, rPerUser, g.users.allow(userKey{r.user.cls, userID}, r.user.l, c.gen, now))
	}
	return 0, nil
}

// blocklist counts the blocklist's decision on a request (blocked or not)
// and returns errBlocked when it refuses (not in shadow mode).
func (g *Guard) blocklist(c *compiled, blocked bool) error {
	if !blocked {
		g.count(rBlocklist, oAllowed)
		return nil
	}
	if c.st.ShadowQueue.Rules[ShadowBlocklist] && !c.shadow[rBlocklist] {
		// Bound for the shadow queue at join: every route lets them
		// through, so that nothing tells them (they are never admitted,
		// so nothing of theirs buys).
		g.count(rBlocklist, oShadowQueue)
		return nil
	}
	if g.refuse(c, rBlocklist, oBlocked) {
		return nil
	}
	return errBlocked
}

// limited counts a rate limit's decision, wait being what its limiter
// answered (0: allowed), and returns the wait with errRateLimited when it
// refuses (not in shadow mode).
func (g *Guard) limited(c *compiled, rule int, wait time.Duration) (time.Duration, error) {
	if wait <= 0 {
		g.count(rule, oAllowed)
		return 0, nil
	}
	if g.refuse(c, rule, oLimited) {
		return 0, nil
	}
	return wait, errRateLimited
}

// CheckJoin is the waiting room's check when a shopper joins a sale's
// queue: the address and user blocklist, then proof of work when the
// difficulty is above 0. Results:
//
//   - nil, nil: pass.
//   - challenge, nil: send the challenge ({"type":"challenge",...}) and
//     expect a join carrying its solution in "pow". This is also the answer
//     to a missing, malformed, forged, foreign (other user or sale),
//     expired, reused or too easy solution.
//   - nil, BLOCKED *flashsale.Error: refuse and close.
//   - nil, an UNAVAILABLE error: Redis could not record the solution as
//     spent; the shopper may retry.
//
// Rate limits are not applied here; the caller applies CheckAddr and
// CheckUser with class "join" as for any request.
func (g *Guard) CheckJoin(ctx context.Context, ip netip.Addr, userID, saleID int64, pow json.RawMessage) (json.RawMessage, error) {
	c := g.cur.Load()
	ip = normAddr(ip)
	if c.addrBlocked(ip) || c.userBlocked(userID) {
		if c.st.ShadowQueue.Rules[ShadowBlocklist] && !c.shadow[rBlocklist] {
			g.count(rBlocklist, oShadowQueue)
			return nil, &flashsale.Shadow{Rule: ShadowBlocklist}
		}
		if !g.refuse(c, rBlocklist, oBlocked) {
			return nil, errBlocked
		}
	} else {
		g.count(rBlocklist, oAllowed)
	}
	if c.powDifficulty == 0 {
		return nil, nil
	}
	now := g.now()
	reason := errPowMalformed
	if len(pow) > 0 && string(pow) != "null" {
		s, err := checkPowSolution(g.cfg.PowKey, pow, c.powDifficulty, userID, saleID, now)
		if err == nil {
			err = g.spend(ctx, s, now)
			if err == nil {
				g.count(rPow, oAllowed)
				return nil, nil
			}
			if !errors.Is(err, errPowSpent) {
				return nil, err
			}
		}
		reason = err
	}
	if c.shadow[rPow] {
		g.count(rPow, oShadow)
		return nil, nil
	}
	if len(pow) > 0 && string(pow) != "null" && c.st.ShadowQueue.Rules[ShadowPow] {
		// A solution was sent and is no good: no second chance, and no
		// sign of it either.
		g.count(rPow, oShadowQueue)
		return nil, &flashsale.Shadow{Rule: ShadowPow}
	}
	g.count(rPow, oChallenged)
	if len(pow) > 0 {
		g.logger.Debug("proof of work refused", "reason", reason.Error(), "user", userID, "sale", saleID)
	}
	ch, err := newPowChallenge(g.cfg.PowKey, c.powDifficulty, userID, saleID, now.Add(g.cfg.PowTTL))
	if err != nil {
		return nil, fmt.Errorf("defense.CheckJoin: %w", err)
	}
	return ch, nil
}

func (g *Guard) spend(ctx context.Context, s powSolution, now time.Time) error {
	if g.rdb == nil {
		return fmt.Errorf("defense.CheckJoin: %w: no Redis client for proof-of-work single use", errUnavailable)
	}
	err := spendPow(ctx, g.rdb, s, now)
	if err == nil || errors.Is(err, errPowSpent) {
		return err
	}
	return fmt.Errorf("defense.CheckJoin: %w: %w", errUnavailable, err)
}

func (c *compiled) addrBlocked(ip netip.Addr) bool {
	if len(c.blockBits) == 0 || !ip.IsValid() {
		return false
	}
	is6 := ip.Is6()
	for _, l := range c.blockBits {
		if l.v6 != is6 {
			continue
		}
		p, err := ip.Prefix(l.bits)
		if err != nil {
			continue
		}
		if _, ok := c.blockNets[p]; ok {
			return true
		}
	}
	return false
}

func (c *compiled) userBlocked(id int64) bool {
	if len(c.blockUsers) == 0 {
		return false
	}
	_, ok := c.blockUsers[id]
	return ok
}

// addrPrefix returns the /24 of an IPv4 or the /64 of an IPv6 address.
func addrPrefix(ip netip.Addr) (netip.Addr, bool) {
	bits := 24
	if ip.Is6() {
		bits = 64
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return netip.Addr{}, false
	}
	return p.Addr(), true
}

// refuse counts a would-be refusal by rule and reports whether the rule is
// in shadow mode (the caller then lets the request through).
func (g *Guard) refuse(c *compiled, rule, outcome int) (shadow bool) {
	if c.shadow[rule] {
		g.count(rule, oShadow)
		return true
	}
	g.count(rule, outcome)
	return false
}

func (g *Guard) count(rule, outcome int) { g.counts[rule][outcome].Add(1) }

// Counters returns the decision counts of every rule and outcome, summed
// over the live gateways: this one's since its Guard was made, and the
// others' as read at most figuresEvery ago (Run reads them; a gateway
// that stopped publishing drops out within figuresTTL plus figuresEvery).
// Without Redis, or when the others' figures could not be read for
// figuresTTL, they are this gateway's only, without Gateways. It does no
// I/O.
func (g *Guard) Counters() []Counter {
	out := g.localCounters()
	v := g.fleet.Load()
	if v == nil || g.now().Sub(v.at) > figuresTTL {
		return out
	}
	i := 0
	for r, outs := range ruleOutcomes {
		for _, o := range outs {
			c := &out[i]
			i++
			c.Gateways = make(map[string]uint64, 1+len(v.others))
			c.Gateways[g.id] = c.Count
			for _, f := range v.others {
				c.Gateways[f.id] = f.counts[r][o]
				c.Count += f.counts[r][o]
			}
		}
	}
	return out
}

// localCounters returns this gateway's decision counts since the Guard was
// made (the metrics export these: Prometheus sums the fleet itself).
func (g *Guard) localCounters() []Counter {
	var out []Counter
	for r, outs := range ruleOutcomes {
		for _, o := range outs {
			out = append(out, Counter{Rule: ruleNames[r], Outcome: outcomeNames[o], Count: g.counts[r][o].Load()})
		}
	}
	return out
}

// EvictIdle drops rate-limit buckets unused for IdleEvict (Run does this
// periodically) and returns how many it dropped.
func (g *Guard) EvictIdle() int {
	cutoff := g.now().Add(-g.cfg.IdleEvict)
	return g.ips.evictIdle(cutoff) + g.prefixes.evictIdle(cutoff) + g.users.evictIdle(cutoff)
}

// Run loads the stored settings, then follows changes: at once on a pub/sub
// announcement, and by polling the stored version every PollInterval in
// case an announcement is lost. It also evicts idle buckets and, with
// Redis, shares the rate-limit spend with the other gateways (when
// ShareInterval is set) and publishes and reads the fleet's figures. A
// failing load is logged and retried at the next poll. It returns nil
// when ctx ends, after the loops it started have stopped.
func (g *Guard) Run(ctx context.Context, store *Store) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g.startFleet(ctx, &wg)
	var msgs <-chan *redis.Message
	if g.rdb != nil {
		ps := g.rdb.Subscribe(ctx, lua.SettingsChannel)
		defer ps.Close()
		msgs = ps.Channel()
	}
	g.reload(ctx, store, -1)
	poll := time.NewTicker(g.cfg.PollInterval)
	defer poll.Stop()
	evictEvery := g.cfg.IdleEvict / 2
	if evictEvery < time.Second {
		evictEvery = time.Second
	}
	evict := time.NewTicker(evictEvery)
	defer evict.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				msgs = nil
				continue
			}
			v, err := strconv.ParseInt(m.Payload, 10, 64)
			if err != nil {
				v = -1
			}
			g.reload(ctx, store, v)
		case <-poll.C:
			v, err := store.Version(ctx)
			if err != nil {
				if ctx.Err() == nil {
					g.logger.Warn("settings version poll failed", "err", err)
				}
				continue
			}
			g.reload(ctx, store, v)
		case <-evict.C:
			if n := g.EvictIdle(); n > 0 {
				g.logger.Debug("evicted idle rate-limit buckets", "count", n)
			}
		}
	}
}

// reload loads and applies the stored settings unless version (-1:
// unknown) is the one applied.
func (g *Guard) reload(ctx context.Context, store *Store, version int64) {
	cur := g.cur.Load().st.Version
	if version >= 0 && version == cur {
		return
	}
	st, err := store.Get(ctx)
	if err != nil {
		if ctx.Err() == nil {
			g.logger.Warn("settings load failed", "err", err)
		}
		return
	}
	if st.Version == cur && version >= 0 {
		return
	}
	g.Apply(st)
	g.logger.Info("settings applied", "version", st.Version, "preset", st.Preset)
}

// guardCollector exports the counters as flashsale_defense_decisions_total
// and the bucket counts as flashsale_defense_limiter_keys.
type guardCollector struct{ g *Guard }

var (
	decisionsDesc = prometheus.NewDesc("flashsale_defense_decisions_total",
		"Bot-defense decisions by rule and outcome.", []string{"rule", "outcome"}, nil)
	keysDesc = prometheus.NewDesc("flashsale_defense_limiter_keys",
		"Rate-limit buckets held in memory, by rule.", []string{"rule"}, nil)
	versionDesc = prometheus.NewDesc("flashsale_defense_settings_version",
		"Version of the bot-defense settings being enforced.", nil, nil)
)

func (c *guardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- decisionsDesc
	ch <- keysDesc
	ch <- versionDesc
}

func (c *guardCollector) Collect(ch chan<- prometheus.Metric) {
	for _, ct := range c.g.localCounters() {
		ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.CounterValue, float64(ct.Count), ct.Rule, ct.Outcome)
	}
	ch <- prometheus.MustNewConstMetric(keysDesc, prometheus.GaugeValue, float64(c.g.ips.len()), RulePerIP)
	ch <- prometheus.MustNewConstMetric(keysDesc, prometheus.GaugeValue, float64(c.g.prefixes.len()), RulePerPrefix)
	ch <- prometheus.MustNewConstMetric(keysDesc, prometheus.GaugeValue, float64(c.g.users.len()), RulePerUser)
	ch <- prometheus.MustNewConstMetric(versionDesc, prometheus.GaugeValue, float64(c.g.cur.Load().st.Version))
}
