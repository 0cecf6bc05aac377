package waitroom

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// The draw orders the pre-queue: pre-queue ticket i (0-based, in the order
// tickets were handed out) gets place Permute(seed, n, i) among the n
// pre-queue tickets. docs/DRAW.md describes the construction so that anyone
// can recompute it; the description and this code must stay in step.

// drawRounds is the number of Feistel rounds.
const drawRounds = 8

// drawLabel separates the draw's key derivation from any other use of the
// seed and names the draw's version (docs/DRAW.md). The key is derived once
// per draw and AES-128 is the round function (as in NIST's FF1
// format-preserving encryption), because every pre-queued shopper's place
// is computed at the instant of opening, when the CPU is needed most.
const drawLabel = "flashsale/draw/v2"

// Permuter computes the draw for one seed and one pre-queue size. It reuses
// its block buffers, so it is not safe for concurrent use.
type Permuter struct {
	n       uint64
	half    uint // bits per Feistel half
	mask    uint64
	block   cipher.Block
	in, out [aes.BlockSize]byte
}

// NewPermuter returns the permutation of [0, n) keyed by seed.
func NewPermuter(seed []byte, n uint64) *Permuter {
	p := &Permuter{n: n}
	bits := uint(0)
	for n > 1 && (uint64(1)<<bits) < n {
		bits++
	}
	p.half = (bits + 1) / 2
	if p.half == 0 {
		p.half = 1
	}
	p.mask = uint64(1)<<p.half - 1
	m := hmac.New(sha256.New, seed)
	m.Write([]byte(drawLabel))
	m.Write(binary.BigEndian.AppendUint64(nil, n))
	block, err := aes.NewCipher(m.Sum(nil)[:16])
	if err != nil {
		panic("waitroom: NewPermuter: " + err.Error()) // a 16-byte key is always valid
	}
	p.block = block
	return p
}

// round is the Feistel round function: the first 8 bytes, big-endian, of
// AES-128 with the draw key over the block round | 7 zero bytes | x,
// masked to half bits.
func (p *Permuter) round(r byte, x uint64) uint64 {
	p.in[0] = r
	binary.BigEndian.PutUint64(p.in[8:], x)
	p.block.Encrypt(p.out[:], p.in[:])
	return binary.BigEndian.Uint64(p.out[:8]) & p.mask
}

// encrypt is the balanced Feistel network over [0, 2^(2*half)).
func (p *Permuter) encrypt(x uint64) uint64 {
	l, r := x>>p.half, x&p.mask
	for i := 0; i < drawRounds; i++ {
		l, r = r, l^p.round(byte(i), r)
	}
	return l<<p.half | r
}

// Place returns the place (0-based) of pre-queue ticket i. It panics when
// i >= n.
func (p *Permuter) Place(i uint64) uint64 {
	if i >= p.n {
		panic("waitroom: Permuter.Place: index out of range")
	}
	if p.n == 1 {
		return 0
	}
	// Cycle walking: the Feistel domain is at most 4n, so this ends after a
	// few steps on average and always ends (a permutation's cycle through i
	// returns to i, which is < n).
	y := p.encrypt(i)
	for y >= p.n {
		y = p.encrypt(y)
	}
	return y
}

// tierLabel separates the seeds of a tiered draw's groups from every other
// use of the seed (docs/DRAW.md "Tiers in the draw").
const tierLabel = "flashsale/draw/tier/v1"

// Draw is a sale's drawn order of its n pre-queue tickets. Untiered (the
// sale's access did not set drawByTier when the pre-queue closed), ticket
// i's place is Permute(seed, n, i). Tiered, the tickets form groups by
// the tier their holder joined with, tier 1 first, then 2 .. MaxTier,
// then the tickets of no tier; a group's tickets take the places after
// the groups before it, in the order of the group's own permutation
// (Permute(tierSeed(seed, tier), size, index within the group)). It is
// not safe for concurrent use (Permuter).
type Draw struct {
	n    uint64
	flat *Permuter // untiered
	// Tiered: per ticket its tier (0: none) and its index in its tier's
	// group, in ticket order; per tier its group's first place and
	// permutation.
	tier  []uint8
	index []uint32
	first [flashsale.MaxTier + 1]uint64
	perm  [flashsale.MaxTier + 1]*Permuter
}

// NewDraw returns the draw of n pre-queue tickets keyed by seed. With
// tiered, tiers holds a digit per ticket in ticket order ('1' to '9'; any
// other byte, and a ticket beyond its end, is no tier), as Redis and the
// public record keep them.
func NewDraw(seed []byte, n uint64, tiered bool, tiers []byte) *Draw {
	d := &Draw{n: n}
	if !tiered {
		d.flat = NewPermuter(seed, n)
		return d
	}
	d.tier = make([]uint8, n)
	d.index = make([]uint32, n)
	var size [flashsale.MaxTier + 1]uint64
	for i := range n {
		t := uint8(0)
		if i < uint64(len(tiers)) {
			t = TierOf(tiers[i])
		}
		d.tier[i], d.index[i] = t, uint32(size[t])
		size[t]++
	}
	var at uint64
	for _, t := range drawTierOrder {
		d.first[t] = at
		at += size[t]
		if size[t] > 0 {
			d.perm[t] = NewPermuter(TierSeed(seed, t), size[t])
		}
	}
	return d
}

// drawTierOrder is the order of a tiered draw's groups: tier 1 first, no
// tier (0) last.
var drawTierOrder = [flashsale.MaxTier + 1]uint8{1, 2, 3, 4, 5, 6, 7, 8, 9, 0}

// TierOf reads a tier digit ('1' to '9'); any other byte is no tier (0).
func TierOf(b byte) uint8 {
	if b >= '1' && b <= '0'+flashsale.MaxTier {
		return b - '0'
	}
	return 0
}

// tierDigits is the tiers of tickets from .. from+n-1 as n digits ('0'
// for no tier, and for a ticket beyond tiers' end), as the public record
// and the checkpoint keep them.
func tierDigits(tiers []byte, from, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = '0'
		if j := from + i; j < len(tiers) {
			out[i] += TierOf(tiers[j])
		}
	}
	return out
}

// TierBlock is one tier's places in a draw by tier: Count places from
// First (Tier 0: the tickets of no tier).
type TierBlock struct {
	Tier         uint8
	First, Count int
}

// TierBlocks is each tier's block of places in the draw by tier of a
// pre-queue whose tickets have tiers (a digit each, as the public record
// lists them), in drawn order; tiers with no ticket are left out.
func TierBlocks(tiers string) []TierBlock {
	var size [flashsale.MaxTier + 1]int
	for i := 0; i < len(tiers); i++ {
		size[TierOf(tiers[i])]++
	}
	var out []TierBlock
	at := 0
	for _, t := range drawTierOrder {
		if size[t] > 0 {
			out = append(out, TierBlock{Tier: t, First: at, Count: size[t]})
			at += size[t]
		}
	}
	return out
}

// TierSeed is the seed of tier t's group in a tiered draw (0: no tier):
// HMAC-SHA256(key = seed, msg = "flashsale/draw/tier/v1" || t as 1 byte).
func TierSeed(seed []byte, t uint8) []byte {
	m := hmac.New(sha256.New, seed)
	m.Write([]byte(tierLabel))
	m.Write([]byte{t})
	return m.Sum(nil)
}

// Place returns the place (0-based) of pre-queue ticket i. It panics when
// i >= n.
func (d *Draw) Place(i uint64) uint64 {
	if d.flat != nil {
		return d.flat.Place(i)
	}
	if i >= d.n {
		panic("waitroom: Draw.Place: index out of range")
	}
	t := d.tier[i]
	return d.first[t] + d.perm[t].Place(uint64(d.index[i]))
}

// Permute returns the place (0-based) of pre-queue ticket i among n
// pre-queue tickets for the draw keyed by seed (docs/DRAW.md). It panics
// when i >= n.
func Permute(seed []byte, n, i uint64) uint64 { return NewPermuter(seed, n).Place(i) }

// DrawReport is what VerifyDraw found.
type DrawReport struct {
	SaleID int64
	// Commitment is the sale's published commitment; CommitmentOK reports
	// whether it is the hex SHA-256 of the seed.
	Commitment   string
	SeedHex      string
	CommitmentOK bool
	// Drawn reports whether the draw has happened (the pre-queue is frozen).
	Drawn bool
	// PreQueue is the pre-queue's user ids in ticket order; Order the same
	// users in drawn order (Order[place] = user id).
	PreQueue []int64
	Order    []int64
	// Tiered reports a draw by tier; Tiers is then each pre-queue
	// ticket's tier, a digit each ('0': none), in ticket order.
	Tiered bool
	Tiers  string
	// Checked is the number of admission records compared with the draw;
	// Mismatches describes the first few disagreements.
	Checked    int
	Mismatches []string
	OK         bool
}

// drawnQueue is a sale's pre-queue as Redis holds it.
type drawnQueue struct {
	n      int64 // the pre-queue's size, -1 before the draw
	tiered bool  // the draw groups the pre-queue by tier (Draw)
	// users are the pre-queue's holders in ticket order (every joiner so
	// far before the draw); 0 marks a ticket nobody could name after a
	// Redis loss. tiers is a digit per ticket (NewDraw), read only for a
	// tiered draw.
	users []int64
	tiers []byte
}

// readDrawn reads the sale's pre-queue: its size, whether the draw is
// tiered, its holders and, for a tiered draw, their tiers.
func readDrawn(ctx context.Context, rdb redis.UniversalClient, saleID int64) (drawnQueue, error) {
	q := drawnQueue{n: -1}
	vals, err := rdb.HMGet(ctx, lua.QueueKey(saleID, keyState), fieldN, fieldTiered).Result()
	if err != nil {
		return q, err
	}
	if s, ok := vals[0].(string); ok {
		if q.n, err = strconv.ParseInt(s, 10, 64); err != nil {
			return q, fmt.Errorf("bad pre-queue size %q", s)
		}
	}
	q.tiered = vals[1] != nil
	if q.n == 0 {
		return q, nil
	}
	stop := q.n - 1
	if q.n < 0 {
		stop = -1 // before the draw: every joiner
	}
	pipe := rdb.Pipeline()
	ids := pipe.LRange(ctx, lua.QueueKey(saleID, keyOrder), 0, stop)
	var tiers *redis.StringCmd
	if q.tiered {
		tiers = pipe.GetRange(ctx, lua.QueueKey(saleID, keyTiers), 0, stop)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return q, err
	}
	q.users = make([]int64, len(ids.Val()))
	for i, s := range ids.Val() {
		if q.users[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return q, fmt.Errorf("bad user id %q", s)
		}
	}
	if tiers != nil {
		q.tiers = []byte(tiers.Val())
	}
	return q, nil
}

// draw is the pre-queue's draw with seed (nil before the draw or for an
// empty pre-queue).
func (q drawnQueue) draw(seed []byte) *Draw {
	if q.n <= 0 {
		return nil
	}
	return NewDraw(seed, uint64(q.n), q.tiered, q.tiers)
}

// PreQueue returns the user ids of the sale's pre-queue in ticket order and
// whether the pre-queue is frozen (the draw happened). Before the draw it
// returns the joiners so far.
func PreQueue(ctx context.Context, rdb redis.UniversalClient, saleID int64) (users []int64, frozen bool, err error) {
	q, err := readDrawn(ctx, rdb, saleID)
	if err != nil {
		return nil, false, fmt.Errorf("waitroom.PreQueue: %w", err)
	}
	return q.users, q.n >= 0, nil
}

// Places returns the place in the sale's queue of every user holding a
// ticket (userId → place, 0-based): the drawn place for the n pre-queue
// tickets (Draw with the sale's seed), the ticket itself after them.
// Before the draw it fails. A user who went to the back of the queue has
// the place of their last ticket.
func Places(ctx context.Context, rdb redis.UniversalClient, saleID int64, seed []byte) (map[int64]int64, error) {
	q, err := readDrawn(ctx, rdb, saleID)
	if err != nil {
		return nil, fmt.Errorf("waitroom.Places: %w", err)
	}
	if q.n < 0 {
		return nil, fmt.Errorf("waitroom.Places: sale %d: not drawn", saleID)
	}
	ids, err := rdb.LRange(ctx, lua.QueueKey(saleID, keyOrder), q.n, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("waitroom.Places: %w", err)
	}
	d := q.draw(seed)
	out := make(map[int64]int64, len(q.users)+len(ids))
	for t, u := range q.users {
		if u != 0 { // 0: a ticket nobody could name after a Redis loss
			out[u] = int64(d.Place(uint64(t)))
		}
	}
	for i, s := range ids {
		if u, err := strconv.ParseInt(s, 10, 64); err == nil && u != 0 {
			out[u] = q.n + int64(i)
		}
	}
	return out, nil
}

// VerifyDraw recomputes the sale's draw from its seed and the pre-queue
// stored in Redis and checks it against what the room did: the commitment
// matches the seed, every recorded admission carries the place the draw
// (or, after the pre-queue, the ticket) gives, and no admission lies beyond
// the "now serving" cursor. It is what `flashsale verify-draw` runs.
func VerifyDraw(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale) (DrawReport, error) {
	rep := DrawReport{SaleID: sale.ID, Commitment: sale.ShuffleCommitment, SeedHex: sale.SeedHex()}
	sum := sha256.Sum256(sale.ShuffleSeed)
	rep.CommitmentOK = len(sale.ShuffleSeed) > 0 && strings.EqualFold(hex.EncodeToString(sum[:]), sale.ShuffleCommitment)
	if !rep.CommitmentOK {
		rep.Mismatches = append(rep.Mismatches, "commitment is not the SHA-256 of the seed")
	}
	q, err := readDrawn(ctx, rdb, sale.ID)
	if err != nil {
		return rep, fmt.Errorf("waitroom.VerifyDraw: %w", err)
	}
	users, frozen := q.users, q.n >= 0
	rep.PreQueue, rep.Drawn, rep.Tiered = users, frozen, q.tiered
	n := uint64(len(users))
	if frozen && n != uint64(q.n) {
		rep.Mismatches = append(rep.Mismatches, fmt.Sprintf("%d of %d pre-queue tickets in Redis", n, q.n))
	}
	preTicket := make(map[int64]uint64, len(users))
	var perm *Draw
	if frozen && n > 0 {
		rep.Order = make([]int64, n)
		perm = NewDraw(sale.ShuffleSeed, n, q.tiered, q.tiers)
		for i, u := range users {
			rep.Order[perm.Place(uint64(i))] = u
			preTicket[u] = uint64(i)
		}
		if q.tiered {
			rep.Tiers = string(tierDigits(q.tiers, 0, int(n)))
		}
	}
	st, err := rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyState)).Result()
	if err != nil {
		return rep, fmt.Errorf("waitroom.VerifyDraw: %w", err)
	}
	serving, _ := strconv.ParseInt(st[fieldServing], 10, 64)
	tickets, err := rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyTickets)).Result()
	if err != nil {
		return rep, fmt.Errorf("waitroom.VerifyDraw: %w", err)
	}
	adm, err := rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyAdmitted)).Result()
	if err != nil {
		return rep, fmt.Errorf("waitroom.VerifyDraw: %w", err)
	}
	mismatch := func(format string, args ...any) {
		if len(rep.Mismatches) < 20 {
			rep.Mismatches = append(rep.Mismatches, fmt.Sprintf(format, args...))
		}
	}
	if !frozen && len(adm) > 0 {
		mismatch("%d admissions recorded before the draw", len(adm))
	}
	for us, v := range adm {
		rep.Checked++
		uid, err1 := strconv.ParseInt(us, 10, 64)
		place, _, err2 := parseAdmission(v)
		ticket, err3 := strconv.ParseInt(tickets[us], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			mismatch("user %s: malformed records (admission %q, ticket %q)", us, v, tickets[us])
			continue
		}
		want := ticket
		if ticket < int64(n) {
			if perm == nil {
				mismatch("user %d: pre-queue ticket %d before the draw", uid, ticket)
				continue
			}
			if i, ok := preTicket[uid]; !ok || int64(i) != ticket {
				mismatch("user %d: ticket %d is not this user's pre-queue entry", uid, ticket)
				continue
			}
			want = int64(perm.Place(uint64(ticket)))
		}
		if place != want {
			mismatch("user %d: admitted at place %d, draw gives %d", uid, place, want)
		}
		if place >= serving {
			mismatch("user %d: admitted at place %d beyond now-serving %d", uid, place, serving)
		}
	}
	rep.OK = len(rep.Mismatches) == 0
	return rep, nil
}

// parseAdmission parses an admission record "place|admittedAtMs".
func parseAdmission(v string) (place, atMs int64, err error) {
	ps, as, ok := strings.Cut(v, "|")
	if !ok {
		return 0, 0, errors.New("no separator")
	}
	if place, err = strconv.ParseInt(ps, 10, 64); err != nil {
		return 0, 0, err
	}
	if atMs, err = strconv.ParseInt(as, 10, 64); err != nil {
		return 0, 0, err
	}
	return place, atMs, nil
}
