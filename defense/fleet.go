package defense

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis names of the fleet. Each is a single untagged key or channel and
// no command touches two of them, so they work on a Redis Cluster (a
// PUBLISH reaches every node's subscribers).
const (
	// spendChannel carries the spend messages of every gateway.
	spendChannel = "fs:defense:spend"
	// gatewaysKey is the SET of gateway ids that publish figures.
	gatewaysKey = "fs:defense:gateways"
	// gatewayKeyPrefix + id is a gateway's HASH "rule/outcome" → count,
	// expiring figuresTTL after its last publish.
	gatewayKeyPrefix = "fs:defense:gw:"
)

// Fleet figures timing: each gateway publishes its counters every
// figuresEvery and reads the others'; a gateway that stops publishing
// drops out of the sum once its hash expires (figuresTTL) and the others
// read again.
const (
	figuresEvery = time.Second
	figuresTTL   = 5 * time.Second
)

// Spend wire format limits.
const (
	spendMagic     = "fs1"
	maxSpendMsg    = 64 << 10 // a publish stays one modest pub/sub message
	maxIDLen       = 255
	maxSpendPerKey = 1 << 24 // more than any limit lets one key spend between two shares
)

// Spend entry kinds on the wire: the rule and address family of the key.
const (
	kindIP4 = 1 + iota
	kindIP6
	kindPrefix4
	kindPrefix6
	kindUser
)

// spendMsg is one decoded spend message: the sender's instance, its class
// table (wire class id → class name; id 0, the default buckets, is never
// listed) and what its keys spent since its previous message.
type spendMsg struct {
	from    string
	classes map[uint8]string
	entries []spendEntry
}

type spendEntry struct {
	kind byte
	cls  uint8 // the sender's class id
	addr netip.Addr
	user int64
	n    uint32
}

var errSpendMalformed = errors.New("malformed spend message")

// parseSpend decodes a spend message. It accepts only what appendSpend
// writes: a truncated, oversized or unknown message is an error and is
// applied not at all.
//
//	"fs1" uvarint(len) from  uvarint(nclasses) {byte id, uvarint(len) name}...
//	{byte kind, byte cls, key (4, 16 or 8 bytes), uvarint n}...
func parseSpend(p []byte) (spendMsg, error) {
	var m spendMsg
	if len(p) > maxSpendMsg || !strings.HasPrefix(string(p), spendMagic) {
		return m, errSpendMalformed
	}
	r := spendReader{p: p[len(spendMagic):]}
	from, ok := r.str()
	if !ok || from == "" {
		return m, errSpendMalformed
	}
	m.from = from
	nc, ok := r.uvarint()
	if !ok || nc > 255 {
		return m, errSpendMalformed
	}
	if nc > 0 {
		m.classes = make(map[uint8]string, nc)
	}
	for range nc {
		id, ok := r.byte()
		if !ok || id == 0 {
			return m, errSpendMalformed
		}
		name, ok := r.str()
		if !ok || name == "" {
			return m, errSpendMalformed
		}
		if _, dup := m.classes[id]; dup {
			return m, errSpendMalformed
		}
		m.classes[id] = name
	}
	for len(r.p) > 0 {
		var e spendEntry
		var ok bool
		if e.kind, ok = r.byte(); !ok {
			return m, errSpendMalformed
		}
		if e.cls, ok = r.byte(); !ok {
			return m, errSpendMalformed
		}
		if _, known := m.classes[e.cls]; e.cls != 0 && !known {
			return m, errSpendMalformed
		}
		switch e.kind {
		case kindIP4, kindPrefix4:
			b, ok := r.bytes(4)
			if !ok {
				return m, errSpendMalformed
			}
			e.addr = netip.AddrFrom4([4]byte(b))
		case kindIP6, kindPrefix6:
			b, ok := r.bytes(16)
			if !ok {
				return m, errSpendMalformed
			}
			e.addr = netip.AddrFrom16([16]byte(b))
			if e.addr.Is4In6() { // the gateway keys such addresses as IPv4
				return m, errSpendMalformed
			}
		case kindUser:
			b, ok := r.bytes(8)
			if !ok {
				return m, errSpendMalformed
			}
			e.user = int64(binary.BigEndian.Uint64(b))
		default:
			return m, errSpendMalformed
		}
		n, ok := r.uvarint()
		if !ok || n == 0 || n > maxSpendPerKey {
			return m, errSpendMalformed
		}
		e.n = uint32(n)
		m.entries = append(m.entries, e)
	}
	return m, nil
}

type spendReader struct{ p []byte }

func (r *spendReader) byte() (byte, bool) {
	if len(r.p) == 0 {
		return 0, false
	}
	b := r.p[0]
	r.p = r.p[1:]
	return b, true
}

func (r *spendReader) bytes(n int) ([]byte, bool) {
	if len(r.p) < n {
		return nil, false
	}
	b := r.p[:n]
	r.p = r.p[n:]
	return b, true
}

func (r *spendReader) uvarint() (uint64, bool) {
	v, n := binary.Uvarint(r.p)
	if n <= 0 {
		return 0, false
	}
	r.p = r.p[n:]
	return v, true
}

func (r *spendReader) str() (string, bool) {
	n, ok := r.uvarint()
	if !ok || n > maxIDLen {
		return "", false
	}
	b, ok := r.bytes(int(n))
	return string(b), ok
}

// spendWriter builds spend messages of at most maxSpendMsg bytes, each
// starting with the same header (sender and class table).
type spendWriter struct {
	header []byte
	buf    []byte
	done   [][]byte
}

func (w *spendWriter) begin(from string, classes map[uint8]string) {
	h := append(w.header[:0], spendMagic...)
	h = appendStr(h, from)
	ids := make([]uint8, 0, len(classes))
	for id := range classes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	h = binary.AppendUvarint(h, uint64(len(ids)))
	for _, id := range ids {
		h = append(h, id)
		h = appendStr(h, classes[id])
	}
	w.header = h
	w.buf = append(w.buf[:0], h...)
	w.done = w.done[:0]
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// add appends one entry; n above maxSpendPerKey is sent as several.
func (w *spendWriter) add(e spendEntry) {
	for n := e.n; n > 0; {
		part := min(n, maxSpendPerKey)
		n -= part
		var rec [1 + 1 + 16 + binary.MaxVarintLen64]byte
		b := append(rec[:0], e.kind, e.cls)
		switch e.kind {
		case kindIP4, kindPrefix4:
			a := e.addr.As4()
			b = append(b, a[:]...)
		case kindIP6, kindPrefix6:
			a := e.addr.As16()
			b = append(b, a[:]...)
		case kindUser:
			b = binary.BigEndian.AppendUint64(b, uint64(e.user))
		}
		b = binary.AppendUvarint(b, uint64(part))
		if len(w.buf)+len(b) > maxSpendMsg && len(w.buf) > len(w.header) {
			w.done = append(w.done, w.buf)
			w.buf = append([]byte(nil), w.header...)
		}
		w.buf = append(w.buf, b...)
	}
}

// finish returns the messages built, none when nothing was added. They
// stay valid until the next begin.
func (w *spendWriter) finish() [][]byte {
	if len(w.buf) > len(w.header) {
		w.done = append(w.done, w.buf)
		w.buf = nil
	}
	return w.done
}

func addrEntry(k addrKey, prefix bool, n uint32) (spendEntry, bool) {
	e := spendEntry{cls: k.cls, addr: k.a, n: n}
	switch {
	case k.a.Is4():
		e.kind = kindIP4
	case k.a.Is6() && !k.a.Is4In6():
		e.kind = kindIP6
	default:
		return e, false
	}
	if prefix {
		e.kind += kindPrefix4 - kindIP4
	}
	return e, true
}

// collectSpend drains what every bucket spent since the last call into
// spend messages.
func (g *Guard) collectSpend() [][]byte {
	w := &g.spendW
	w.begin(g.instance, g.classNames())
	g.ips.drain(func(k addrKey, n uint32) {
		if e, ok := addrEntry(k, false, n); ok {
			w.add(e)
		}
	})
	g.prefixes.drain(func(k addrKey, n uint32) {
		if e, ok := addrEntry(k, true, n); ok {
			w.add(e)
		}
	})
	g.users.drain(func(k userKey, n uint32) {
		w.add(spendEntry{kind: kindUser, cls: k.cls, user: k.id, n: n})
	})
	return w.finish()
}

// classNames returns the class table of this gateway (id → name).
func (g *Guard) classNames() map[uint8]string {
	g.classMu.Lock()
	defer g.classMu.Unlock()
	out := make(map[uint8]string, len(g.classIDs))
	for name, id := range g.classIDs {
		out[id] = name
	}
	return out
}

// applySpend debits another gateway's spend from the buckets this gateway
// holds, and returns how many entries it applied. Its own messages and
// classes this gateway does not know are skipped. Class ids are mapped by
// name: each gateway numbers its classes in the order it met them.
func (g *Guard) applySpend(m spendMsg, now time.Time) int {
	if m.from == g.instance {
		return 0
	}
	var local [256]int16 // sender's class id → local id + 1; 0: unknown
	local[0] = 1
	g.classMu.Lock()
	for id, name := range m.classes {
		if l, ok := g.classIDs[name]; ok {
			local[id] = int16(l) + 1
		}
	}
	g.classMu.Unlock()
	applied := 0
	for _, e := range m.entries {
		l := local[e.cls]
		if l == 0 {
			continue
		}
		cls, n := uint8(l-1), float64(e.n)
		var ok bool
		switch e.kind {
		case kindIP4, kindIP6:
			ok = g.ips.debit(addrKey{cls, e.addr}, n, now)
		case kindPrefix4, kindPrefix6:
			ok = g.prefixes.debit(addrKey{cls, e.addr}, n, now)
		case kindUser:
			ok = g.users.debit(userKey{cls, e.user}, n, now)
		}
		if ok {
			applied++
		}
	}
	return applied
}

// runShare publishes this gateway's spend every ShareInterval and debits
// the others' as their messages come. A failed publish loses that spend
// (the others then allow that much more); it is logged once per outage.
func (g *Guard) runShare(ctx context.Context) {
	ps := g.rdb.Subscribe(ctx, spendChannel)
	defer ps.Close()
	msgs := ps.Channel()
	tick := time.NewTicker(g.cfg.ShareInterval)
	defer tick.Stop()
	// A gateway hears its own messages too; it skips them by their header
	// without decoding them.
	own := string(appendStr([]byte(spendMagic), g.instance))
	var failing, malformed bool
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-msgs:
			if !ok {
				msgs = nil
				continue
			}
			if strings.HasPrefix(msg.Payload, own) {
				continue
			}
			m, err := parseSpend([]byte(msg.Payload))
			if err != nil {
				if !malformed {
					g.logger.Warn("spend message ignored", "err", err)
					malformed = true
				}
				continue
			}
			g.applySpend(m, g.now())
		case <-tick.C:
			err := g.publishSpend(ctx)
			switch {
			case err != nil && !failing && ctx.Err() == nil:
				g.logger.Warn("rate-limit spend not shared: other gateways allow more until it is", "err", err)
				failing = true
			case err == nil && failing:
				g.logger.Info("rate-limit spend shared again")
				failing = false
			}
		}
	}
}

func (g *Guard) publishSpend(ctx context.Context) error {
	msgs := g.collectSpend()
	if len(msgs) == 0 {
		return nil
	}
	_, err := g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, m := range msgs {
			p.Publish(ctx, spendChannel, m)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("defense.publishSpend: %w", err)
	}
	return nil
}

// fleetView is the figures of the other live gateways, as last read.
type fleetView struct {
	at     time.Time
	others []gatewayFigures // by id
}

type gatewayFigures struct {
	id     string
	counts [numRules][numOutcomes]uint64
}

func counterField(rule, outcome int) string { return ruleNames[rule] + "/" + outcomeNames[outcome] }

// parseFigures reads a gateway's hash; unknown fields are skipped (a newer
// gateway may count more).
func parseFigures(id string, h map[string]string) gatewayFigures {
	f := gatewayFigures{id: id}
	for r, outs := range ruleOutcomes {
		for _, o := range outs {
			if v, ok := h[counterField(r, o)]; ok {
				f.counts[r][o], _ = strconv.ParseUint(v, 10, 64)
			}
		}
	}
	return f
}

// runFigures publishes this gateway's counters every figuresEvery and
// reads the other gateways'. On the way out it removes its own, so a
// gateway stopped cleanly drops out of the sum at once.
func (g *Guard) runFigures(ctx context.Context) {
	tick := time.NewTicker(figuresEvery)
	defer tick.Stop()
	missing := map[string]bool{}
	var failing bool
	for {
		err := g.syncFigures(ctx, missing)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			g.logger.Warn("fleet defense figures not synced: the admin API shows this gateway's only", "err", err)
			failing = true
		case err == nil && failing:
			g.logger.Info("fleet defense figures synced again")
			failing = false
		}
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = g.rdb.Del(cctx, gatewayKeyPrefix+g.id).Err() //nolint:errcheck // best effort: the hash expires anyway
			_ = g.rdb.SRem(cctx, gatewaysKey, g.id).Err()    //nolint:errcheck // readers prune it anyway
			return
		case <-tick.C:
		}
	}
}

// syncFigures publishes this gateway's counters and reads the others'. An
// id listed without a hash on two reads in a row is removed from the set
// (one miss may be a gateway between its SADD and HSET).
func (g *Guard) syncFigures(ctx context.Context, missing map[string]bool) error {
	key := gatewayKeyPrefix + g.id
	vals := make([]any, 0, 2*numRules*numOutcomes)
	for _, c := range g.localCounters() {
		vals = append(vals, c.Rule+"/"+c.Outcome, c.Count)
	}
	if _, err := g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, vals...)
		p.PExpire(ctx, key, figuresTTL)
		p.SAdd(ctx, gatewaysKey, g.id)
		return nil
	}); err != nil {
		return fmt.Errorf("defense.syncFigures: publish: %w", err)
	}
	ids, err := g.rdb.SMembers(ctx, gatewaysKey).Result()
	if err != nil {
		return fmt.Errorf("defense.syncFigures: members: %w", err)
	}
	ids = slices.DeleteFunc(ids, func(id string) bool { return id == g.id })
	slices.Sort(ids)
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	if len(ids) > 0 {
		if _, err := g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HGetAll(ctx, gatewayKeyPrefix+id)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("defense.syncFigures: read: %w", err)
		}
	}
	v := &fleetView{at: g.now()}
	var gone []any
	seen := make(map[string]bool, len(ids))
	for i, id := range ids {
		seen[id] = true
		h := cmds[i].Val()
		if len(h) == 0 {
			if missing[id] {
				gone = append(gone, id)
				delete(missing, id)
			} else {
				missing[id] = true
			}
			continue
		}
		delete(missing, id)
		v.others = append(v.others, parseFigures(id, h))
	}
	for id := range missing {
		if !seen[id] {
			delete(missing, id)
		}
	}
	g.fleet.Store(v)
	if len(gone) > 0 {
		if err := g.rdb.SRem(ctx, gatewaysKey, gone...).Err(); err != nil {
			return fmt.Errorf("defense.syncFigures: prune: %w", err)
		}
	}
	return nil
}

// defaultGatewayID is the host name and a random suffix, unique per
// process.
func defaultGatewayID() string {
	var b [3]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24+)
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "gateway"
	}
	if len(host) > 48 {
		host = host[:48]
	}
	return host + "-" + hex.EncodeToString(b[:])
}

func newInstanceID() string {
	var b [8]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// startFleet starts the fleet loops (figures, and spend sharing when on),
// which Run owns and waits for.
func (g *Guard) startFleet(ctx context.Context, wg *sync.WaitGroup) {
	if g.rdb == nil {
		return
	}
	wg.Go(func() { g.runFigures(ctx) })
	if g.users.share {
		wg.Go(func() { g.runShare(ctx) })
	}
}
